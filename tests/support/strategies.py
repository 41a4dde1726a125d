"""Hypothesis strategies for every message type, derived from the dataclass field types."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from common.messages import Message

_text = st.text(max_size=24)
_finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    if tp is int:
        return _ints
    if tp is float:
        return _finite
    if tp is str:
        return _text
    if tp is bool:
        return st.booleans()
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | for_type(inner)
    if origin is tuple:
        return st.lists(for_type(args[0]), max_size=4).map(tuple)
    if origin in (Mapping, dict):
        return st.dictionaries(_text, for_type(args[1]), max_size=4)
    if isinstance(tp, type) and issubclass(tp, enum.StrEnum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return for_dataclass(tp)
    raise TypeError(f"no strategy for {tp!r}")


def for_dataclass(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: for_type(hints[f.name]) for f in dataclasses.fields(cls)})


def messages(types_: tuple[type[Message], ...]) -> st.SearchStrategy[Message]:
    return st.one_of(*(for_dataclass(cls) for cls in types_))
