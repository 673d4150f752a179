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
from typing import Any, Callable

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


def from_plain(tp: Any, value: Any, path: str = "") -> Any:
    """Build an instance of `tp` from plain data, validating every field."""
    return _decoder(tp)(value, path)


# Decoders are built once per type hint: a peer decodes every message and each poll's schedule
# with them, and inspecting the hints afresh each time was a tenth of a busy peer's CPU.
@lru_cache(maxsize=None)
def _decoder(tp: Any) -> Callable[[Any, str], Any]:
    if dataclasses.is_dataclass(tp):
        return _dataclass_decoder(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        return _optional_decoder(type(None) in typing.get_args(tp), inner[0])
    if origin is tuple:
        return _tuple_decoder(tp)
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        return _enum_decoder(tp)
    try:
        return _SCALARS[tp]
    except (KeyError, TypeError):
        pass

    def unsupported(value: Any, path: str) -> Any:
        raise TypeError(f"unsupported field type {tp!r} at {path or '<root>'}")
    return unsupported


def _optional_decoder(allows_none: bool, inner: Any) -> Callable[[Any, str], Any]:
    def decode(value: Any, path: str) -> Any:
        if value is None and allows_none:
            return None
        return _decoder(inner)(value, path)
    return decode


def _enum_decoder(tp: type) -> Callable[[Any, str], Any]:
    def decode(value: Any, path: str) -> Any:
        if type(value) is not int:
            raise FieldError(path or "<root>", f"expected an integer code of {tp.__name__}, got {type(value).__name__}")
        try:
            return tp(value)
        except ValueError:
            raise FieldError(path or "<root>", f"unknown {tp.__name__} code {value}") from None
    return decode


def _exact(tp: type, what: str) -> Callable[[Any, str], Any]:
    def decode(value: Any, path: str) -> Any:
        if type(value) is not tp:
            raise FieldError(path or "<root>", f"expected {what}, got {type(value).__name__}")
        return value
    return decode


def _float(value: Any, path: str) -> float:
    if type(value) not in (int, float):
        raise FieldError(path or "<root>", f"expected a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise FieldError(path or "<root>", "number out of range") from None
    if not math.isfinite(number):
        raise FieldError(path or "<root>", "must be finite")
    return number


def _bytes(value: Any, path: str) -> bytes:
    if type(value) not in (bytes, bytearray):
        raise FieldError(path or "<root>", f"expected bytes, got {type(value).__name__}")
    return bytes(value)


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {
    bool: _exact(bool, "a boolean"), int: _exact(int, "an integer"), str: _exact(str, "a string"),
    float: _float, bytes: _bytes}


def _tuple_decoder(tp: Any) -> Callable[[Any, str], Any]:
    args = typing.get_args(tp)

    def check_list(value: Any, path: str) -> None:
        if not isinstance(value, (list, tuple)):
            raise FieldError(path or "<root>", f"expected a list, got {type(value).__name__}")

    if len(args) == 2 and args[1] is Ellipsis:
        item = args[0]

        def decode_many(value: Any, path: str) -> tuple:
            check_list(value, path)
            one = _decoder(item)
            return tuple(one(v, f"{path}[{i}]") for i, v in enumerate(value))
        return decode_many

    def decode_fixed(value: Any, path: str) -> tuple:
        check_list(value, path)
        if len(value) != len(args):
            raise FieldError(path or "<root>", f"expected {len(args)} items, got {len(value)}")
        return tuple(_decoder(a)(v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    return decode_fixed


def _dataclass_decoder(cls: type) -> Callable[[Any, str], Any]:
    hints = typing.get_type_hints(cls)
    # (name, hint, required): resolved at first use, so that a class may hold itself
    fields = [(f.name, hints[f.name],
               f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
              for f in dataclasses.fields(cls)]

    def decode(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise FieldError(path or "<root>", f"expected a map for {cls.__name__}, got {type(value).__name__}")
        kwargs = {}
        for name, hint, required in fields:
            sub = f"{path}.{name}" if path else name
            if name in value:
                kwargs[name] = _decoder(hint)(value[name], sub)
            elif required:
                raise FieldError(sub, "missing")
        try:
            return cls(**kwargs)
        except FieldError as exc:  # raised by __post_init__ checks: prefix the path
            raise FieldError(f"{path}.{exc.field}" if path else exc.field, exc.problem) from None
        except (ValueError, TypeError) as exc:
            raise FieldError(path or "<root>", str(exc)) from None
    return decode
