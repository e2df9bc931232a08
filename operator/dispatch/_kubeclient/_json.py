"""JSON of the API server's answers, decoded by orjson (what a restart spends most of its time on).

orjson decodes a pod or a PyTorchJob 1.3-1.8 times faster than :mod:`json` (BENCHMARKS.md) and
shares the key strings of the objects it decodes. Where it would answer otherwise than :mod:`json`,
:mod:`json` reads the text instead, so nothing the API server may send is lost or changed: orjson
refuses a lone surrogate escape, and reads an integer past 64 bits as a float (a custom resource may
hold one), so a text with a run of 19 or more digits anywhere (inside a string too: that is only
slower) is left to :mod:`json`. Text that is not JSON raises :mod:`json`'s own ``JSONDecodeError``
(a ``ValueError``) as before.
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

_DIGITS: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
"""Every digit made ``0``, every other byte a space: a run of digits is then found by one ``in``
(a regular expression took longer than decoding the text)."""
_LONG: Final = b"0" * 19
"""2**63 has 19 digits: an integer of fewer digits is one orjson reads exactly."""


def loads(raw: bytes | str) -> Any:
    """The value of one JSON text, exactly as :func:`json.loads` gives it."""
    text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _LONG in text.translate(_DIGITS):
        return json.loads(raw)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def dumps(value: Any) -> bytes:
    """Compact JSON of ``value`` (a decoded body or part of one), as UTF-8."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer past 64 bits (read by json above): json writes it
        return json.dumps(value, separators=(",", ":")).encode()
