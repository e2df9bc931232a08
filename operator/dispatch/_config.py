"""Reading an adapter's configuration that came from text (YAML, the environment, a command line).

Such configs carry booleans as strings; ``bool("false")`` is true, so each value is
parsed strictly here and anything else is a :class:`~dispatch.ConfigError` naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from ._errors import ConfigError

_TRUE: Final = frozenset({"true", "yes", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "off", "0"})


def known_keys(adapter: str, config: Mapping[str, object], keys: set[str] | frozenset[str]) -> None:
    """Refuse keys the adapter does not read (a misspelt key would otherwise be ignored)."""
    unknown = sorted(str(k) for k in config if k not in keys)
    if unknown:
        raise ConfigError(
            f"{adapter} adapter: unknown config key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} (known: {', '.join(sorted(keys))})",
            key=unknown[0],
        )


def flag(adapter: str, config: Mapping[str, object], key: str, default: bool) -> bool:
    """A boolean: a bool, or one of true/false yes/no on/off 1/0 in any case."""
    value = config.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ConfigError(
        f"{adapter} adapter: {key} must be true or false, not {value!r}",
        key=key,
    )


def choice(adapter: str, config: Mapping[str, object], key: str, default: str, choices: list[str]) -> str:
    value = config.get(key, default)
    text = str(value).strip().lower() if isinstance(value, str) else value
    if text not in choices:
        raise ConfigError(
            f"{adapter} adapter: {key} must be one of {', '.join(choices)}, not {value!r}", key=key
        )
    return str(text)


class RereadFile:
    """A file's text (stripped), read again whenever its mtime changes: a mounted Secret or a
    projected service-account token is rotated in place. ``OSError`` is the caller's to name."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: int | None = None
        self.last: str | None = None
        """The text last read, or None."""

    def read(self) -> str:
        stamp = os.stat(self.path).st_mtime_ns
        if self.last is None or stamp != self._stamp:
            with open(self.path, encoding="utf-8") as f:
                self.last = f.read().strip()
            self._stamp = stamp
        return self.last
