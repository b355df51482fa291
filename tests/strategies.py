"""Hypothesis strategies for attrs values, derived from their type hints."""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any

import attrs
from hypothesis import strategies as st

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    if tp is Any:
        return json_values
    if attrs.has(tp):
        return values_of(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([for_type(a) for a in args])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is tuple:
        return st.lists(for_type(args[0]), max_size=3).map(tuple)
    if origin in (dict, collections.abc.Mapping):
        return json_objects
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(min_value=0, max_value=2**53)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False, width=64)
    if tp is str:
        return st.text(max_size=30)
    raise TypeError(f"no strategy for {tp!r}")


def values_of(cls: type[Any]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {a.name: for_type(hints[a.name]) for a in attrs.fields(cls) if a.init}
    return st.builds(cls, **fields)
