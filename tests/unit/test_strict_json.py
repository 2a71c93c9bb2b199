"""strict_json: a value that cannot be stored is named by its path and type, at once."""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

import pytest

from planrun.core._errors import PermanentError, StoreError, UnstorableValue, classify
from planrun.stores import strict_json


@pytest.mark.parametrize("value", [None, 1, 2.5, "x", True, [1, [2, {"a": None}]], (1, 2),
                                   {"a": {"b": [1, "c"]}, "n": -0.0}])
def test_json_values_encode_as_the_standard_library_does(value: Any) -> None:
    assert json.loads(strict_json(value)) == json.loads(json.dumps(value))


@pytest.mark.parametrize(("value", "path", "type_name"), [
    (datetime.datetime(2026, 1, 1), "$", "datetime.datetime"),
    ({"rows": [{"ok": 1}, {"when": datetime.date(2026, 1, 1)}]}, "$.rows[1].when",
     "datetime.date"),
    ({"a b": {1, 2}}, "$['a b']", "set"),
    ([1, [2, b"raw"]], "$[1][1]", "bytes"),
    ({"price": decimal.Decimal("1.5")}, "$.price", "decimal.Decimal"),
    ({"x": float("inf")}, "$.x", "float"),
    ({("a", "b"): 1}, "$", "tuple"),
])
def test_the_first_offending_value_is_named_by_path_and_type(
    value: Any, path: str, type_name: str
) -> None:
    with pytest.raises(UnstorableValue) as info:
        strict_json(value, "task 'a' result")
    message = str(info.value)
    assert message.startswith(f"task 'a' result cannot be stored as JSON: {path} ")
    assert type_name in message and "\n" not in message
    assert (info.value.path, info.value.type_name) == (path, type_name)


def test_a_value_that_contains_itself_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(UnstorableValue, match=r"\$\[1\] is nested too deep"):
        strict_json(loop)


def test_the_error_is_permanent_and_not_a_store_error() -> None:
    with pytest.raises(UnstorableValue) as info:
        strict_json(object())
    assert isinstance(info.value, PermanentError) and not isinstance(info.value, StoreError)
    assert classify(info.value) == "permanent"
