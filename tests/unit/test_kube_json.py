"""dispatch._kubeclient._json: orjson's speed, :mod:`json`'s answers.

Whatever the API server may send decodes to what :mod:`json` gives, including what orjson alone
refuses (an integer past 64 bits in a custom resource, a lone surrogate escape in an annotation);
text that is not JSON still raises :mod:`json`'s ValueError, which the informers and the store
treat as a broken stream.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch._kubeclient._json import dumps, loads

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_decoded_as_json_decodes_it(value: Any) -> None:
    # Compared as JSON text: 2**70 == float(2**70) in Python, yet a float is not the integer sent.
    text = json.dumps(value)
    assert json.dumps(loads(text)) == text
    assert json.dumps(loads(text.encode())) == text
    assert json.dumps(json.loads(dumps(value))) == text


@pytest.mark.parametrize(
    "text",
    [
        '{"spec": {"seed": 123456789012345678901234567890}}',  # past 64 bits: orjson's is a float
        '{"spec": {"seed": 18446744073709551616}}',  # 2**64, the first one past 64 bits
        '{"spec": {"seed": -9223372036854775809}}',  # one below -2**63
        '{"metadata": {"annotations": {"note": "\\ud800"}}}',  # a lone surrogate escape
    ],
)
def test_what_orjson_refuses_or_reads_otherwise_is_read_as_json_reads_it(text: str) -> None:
    assert json.dumps(loads(text)) == json.dumps(json.loads(text))
    assert json.dumps(loads(dumps(loads(text)))) == json.dumps(json.loads(text))


@pytest.mark.parametrize("text", ["{", '{"a": 1} x', "", "NaN-ish", b"\xff\xfe"])
def test_text_that_is_not_json_raises_jsons_error(text: str | bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads(text)
