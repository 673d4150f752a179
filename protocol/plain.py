"""Strict conversion between frozen dataclasses and plain msgpack/JSON values.

Message classes declare their fields with ordinary type hints; this module derives both
directions from them, so the schema lives in exactly one place. Supported hints: int, float,
str, bytes, bool, IntEnum subclasses, `X | None`, `tuple[X, ...]`, fixed `tuple[X, Y]` and
nested dataclasses. Decoding drops unknown keys and names the failing field on error.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from functools import lru_cache
from typing import Any

from protocol.errors import FieldError


def to_plain(value: Any) -> Any:
    """Dataclass tree -> dicts/lists/scalars (enums become ints)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.IntEnum):
        return int(value)
    if isinstance(value, (tuple, list)):
        return [to_plain(v) for v in value]
    return value


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_plain(tp: Any, value: Any, path: str = "") -> Any:
    """Build an instance of `tp` from plain data, validating every field."""
    where = path or "<root>"
    if dataclasses.is_dataclass(tp):
        return _dataclass_from_plain(tp, value, path)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        return from_plain(inner[0], value, path)
    if origin is tuple:
        return _tuple_from_plain(tp, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        if type(value) is not int:
            raise FieldError(where, f"expected an integer code of {tp.__name__}, got {type(value).__name__}")
        try:
            return tp(value)
        except ValueError:
            raise FieldError(where, f"unknown {tp.__name__} code {value}") from None
    if tp is bool:
        if type(value) is not bool:
            raise FieldError(where, f"expected a boolean, got {type(value).__name__}")
        return value
    if tp is int:
        if type(value) is not int:
            raise FieldError(where, f"expected an integer, got {type(value).__name__}")
        return value
    if tp is float:
        if type(value) not in (int, float):
            raise FieldError(where, f"expected a number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:
            raise FieldError(where, "number out of range") from None
        if not math.isfinite(number):
            raise FieldError(where, "must be finite")
        return number
    if tp is str:
        if type(value) is not str:
            raise FieldError(where, f"expected a string, got {type(value).__name__}")
        return value
    if tp is bytes:
        if type(value) not in (bytes, bytearray):
            raise FieldError(where, f"expected bytes, got {type(value).__name__}")
        return bytes(value)
    raise TypeError(f"unsupported field type {tp!r} at {where}")


def _tuple_from_plain(tp: Any, value: Any, path: str) -> tuple:
    where = path or "<root>"
    if not isinstance(value, (list, tuple)):
        raise FieldError(where, f"expected a list, got {type(value).__name__}")
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(from_plain(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise FieldError(where, f"expected {len(args)} items, got {len(value)}")
    return tuple(from_plain(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))


def _dataclass_from_plain(cls: type, value: Any, path: str) -> Any:
    where = path or "<root>"
    if not isinstance(value, dict):
        raise FieldError(where, f"expected a map for {cls.__name__}, got {type(value).__name__}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        sub = f"{path}.{f.name}" if path else f.name
        if f.name in value:
            kwargs[f.name] = from_plain(hints[f.name], value[f.name], sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise FieldError(sub, "missing")
    try:
        return cls(**kwargs)
    except FieldError as exc:  # raised by __post_init__ checks: prefix the path
        raise FieldError(f"{path}.{exc.field}" if path else exc.field, exc.problem) from None
    except (ValueError, TypeError) as exc:
        raise FieldError(where, str(exc)) from None
