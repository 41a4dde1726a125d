"""Field-by-field wire converters for message dataclasses, compiled once per class.

The wire form of a dataclass is a msgpack map of its field names. Supported field types:
``int``, ``float`` (finite only), ``str``, ``bool``, ``T | None``, ``tuple[T, ...]``,
``Mapping[str, T]``, ``enum.StrEnum`` subclasses, and nested dataclasses of these. Anything else
is refused when the class is compiled, so an unsupported field is a programming error found at
import time, not a runtime surprise.

Decoding is strict where it matters for safety (types, finiteness, string keys) and lenient where
it matters for evolution (unknown fields are ignored; missing fields with defaults take them).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any


Decoder = Callable[[Any], Any]
Encoder = Callable[[Any], Any]

_MISSING = dataclasses.MISSING


class FieldError(Exception):
    """A conversion failure deep inside a value; ``path`` grows as it unwinds (cheap: errors only).

    The codec turns it into DecodeError / EncodeError with the full path, e.g.
    ``JobSubmitted.spec.total_steps: expected int, got str``.
    """

    def __init__(self, detail: str, path: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.path = path

    def within(self, segment: str) -> FieldError:
        sep = "" if not self.path or self.path.startswith("[") else "."
        return FieldError(self.detail, f"{segment}{sep}{self.path}")

    def describe(self, root: str) -> str:
        sep = "" if not self.path or self.path.startswith("[") else "."
        return f"{root}{sep}{self.path}: {self.detail}"


def _type_name(v: Any) -> str:
    return "nil" if v is None else type(v).__name__


def _bad(expected: str, v: Any) -> FieldError:
    return FieldError(f"expected {expected}, got {_type_name(v)}")


# --- decoders: wire value -> Python value ------------------------------------------------------


def _dec_int(v: Any) -> int:
    if type(v) is not int:
        raise _bad("int", v)
    return v


def _dec_float(v: Any) -> float:
    if type(v) is float:
        if not math.isfinite(v):
            raise FieldError(f"not a finite number ({v})")
        return v
    if type(v) is int:
        return float(v)
    raise _bad("float", v)


def _dec_str(v: Any) -> str:
    if type(v) is not str:
        raise _bad("str", v)
    return v


def _dec_bool(v: Any) -> bool:
    if type(v) is not bool:
        raise _bad("bool", v)
    return v


# --- encoders: Python value -> wire value ------------------------------------------------------


def _enc_float(v: Any) -> float:
    if type(v) is float:
        if not math.isfinite(v):
            raise FieldError(f"not a finite number ({v})")
        return v
    if type(v) is int:
        return float(v)
    # numpy scalars and other reals are accepted but normalised to a Python float
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _enc_float(float(v))
    raise _bad("float", v)


def _exact(py_type: type, name: str) -> Encoder:
    def enc(v: Any) -> Any:
        if type(v) is not py_type:
            raise _bad(name, v)
        return v

    return enc


def _enc_int(v: Any) -> int:
    if type(v) is int:
        return v
    # numpy integers are accepted (the cores compute with numpy) but sent as plain ints
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    raise _bad("int", v)


_PRIMITIVES: dict[Any, tuple[Encoder, Decoder]] = {
    int: (_enc_int, _dec_int),
    float: (_enc_float, _dec_float),
    str: (_exact(str, "str"), _dec_str),
    bool: (_exact(bool, "bool"), _dec_bool),
}


def converters(tp: Any) -> tuple[Encoder, Decoder]:
    """(encoder, decoder) for a field type; TypeError for a type the wire cannot carry."""
    if tp in _PRIMITIVES:
        return _PRIMITIVES[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1 or len(args) != 2:
            raise TypeError(f"only `T | None` unions are supported, got {tp}")
        return _optional(*converters(inner[0]))
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"only tuple[T, ...] is supported, got {tp}")
        return _sequence(*converters(args[0]))
    if origin in (Mapping, dict):
        if args[0] is not str:
            raise TypeError(f"mapping keys must be str, got {tp}")
        return _mapping(*converters(args[1]))
    if isinstance(tp, type) and issubclass(tp, enum.StrEnum):
        return _enum(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return compile_dataclass(tp)
    raise TypeError(f"unsupported field type {tp!r}")


def _optional(enc: Encoder, dec: Decoder) -> tuple[Encoder, Decoder]:
    def enc_opt(v: Any) -> Any:
        return None if v is None else enc(v)

    def dec_opt(v: Any) -> Any:
        return None if v is None else dec(v)

    return enc_opt, dec_opt


def _sequence(enc: Encoder, dec: Decoder) -> tuple[Encoder, Decoder]:
    def enc_seq(v: Any) -> list[Any]:
        if not isinstance(v, (tuple, list)):
            raise _bad("tuple", v)
        out = []
        for i, x in enumerate(v):
            try:
                out.append(enc(x))
            except FieldError as e:
                raise e.within(f"[{i}]") from None
        return out

    def dec_seq(v: Any) -> tuple[Any, ...]:
        if type(v) is not list:
            raise _bad("array", v)
        out = []
        for i, x in enumerate(v):
            try:
                out.append(dec(x))
            except FieldError as e:
                raise e.within(f"[{i}]") from None
        return tuple(out)

    return enc_seq, dec_seq


def _mapping(enc: Encoder, dec: Decoder) -> tuple[Encoder, Decoder]:
    def enc_map(v: Any) -> dict[str, Any]:
        if not isinstance(v, Mapping):
            raise _bad("mapping", v)
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                raise FieldError(f"keys must be str, got {_type_name(k)}")
            try:
                out[k] = enc(x)
            except FieldError as e:
                raise e.within(f"[{k!r}]") from None
        return out

    def dec_map(v: Any) -> dict[str, Any]:
        if type(v) is not dict:
            raise _bad("map", v)
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                raise FieldError(f"keys must be str, got {_type_name(k)}")
            try:
                out[k] = dec(x)
            except FieldError as e:
                raise e.within(f"[{k[:64]!r}]") from None
        return out

    return enc_map, dec_map


def _enum(tp: type[enum.StrEnum]) -> tuple[Encoder, Decoder]:
    allowed = {m.value: m for m in tp}
    expected = " | ".join(allowed)

    def enc_enum(v: Any) -> str:
        if isinstance(v, tp):
            return v.value
        if type(v) is str and v in allowed:
            return v
        raise FieldError(f"expected one of {expected}, got {v!r}")

    def dec_enum(v: Any) -> enum.StrEnum:
        if type(v) is not str:
            raise _bad(expected, v)
        member = allowed.get(v)
        if member is None:
            raise FieldError(f"expected one of {expected}, got {v[:64]!r}")
        return member

    return enc_enum, dec_enum


_compiled: dict[type, tuple[Encoder, Decoder]] = {}


def compile_dataclass(cls: type) -> tuple[Encoder, Decoder]:
    """(encoder, decoder) for a dataclass: a map of its fields. Cached per class."""
    cached = _compiled.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    plan: list[tuple[str, Encoder, Decoder, Any]] = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not _MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: use an immutable default, not a factory")
        enc, dec = converters(hints[f.name])
        plan.append((f.name, enc, dec, f.default))
    name = cls.__name__

    def enc_dc(v: Any) -> dict[str, Any]:
        if type(v) is not cls:
            raise _bad(name, v)
        out = {}
        for fname, fenc, _, _ in plan:
            try:
                out[fname] = fenc(getattr(v, fname))
            except FieldError as e:
                raise e.within(fname) from None
        return out

    def dec_dc(v: Any) -> Any:
        if type(v) is not dict:
            raise _bad(f"{name} map", v)
        kwargs = {}
        for fname, _, fdec, default in plan:
            if fname in v:
                try:
                    kwargs[fname] = fdec(v[fname])
                except FieldError as e:
                    raise e.within(fname) from None
            elif default is _MISSING:
                raise FieldError("missing field", fname)
        return cls(**kwargs)

    _compiled[cls] = (enc_dc, dec_dc)
    return enc_dc, dec_dc
