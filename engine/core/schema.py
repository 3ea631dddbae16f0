"""Typed decoding of parsed JSON into frozen dataclasses, driven by the dataclasses' own field
annotations (``typing.get_type_hints``), so the records in ``engine.core.trace`` are their own schema.

    decode(StepTrace, {"_type": "StepTrace", "step": 0, ...})  # -> StepTrace, or SchemaError

Rules, one per annotation (anything else is a bug in the record definition: TypeError):

    int                a JSON integer (true/false are not integers), |x| <= 2**53
    float              a JSON number (an integer is taken as a float), finite (no NaN / Infinity)
    bool               true or false
    str                a string
    Literal[a, b]      exactly one of the listed values
    an Enum subclass   one of its members' values (decoded to the member)
    X | None           null, or an X
    tuple[X, ...]      an array whose every item is an X (decoded to a tuple)
    Mapping[str, X]    an object whose every value is an X (decoded to a dict)
    Any                a JSON scalar: string, number (as int/float above), true/false or null
    Annotated[Mapping[str, Any], Nested(keys)]  an object of scalars or arrays of scalars (to
                       tuples); the named keys may also hold one object of those (a config)
    a dataclass        an object with exactly the dataclass's fields (a field with a default may
                       be left out; an unknown key is an error); a *tagged* dataclass must also
                       carry ``"_type": "<ClassName>"``
    Annotated[X, *rules]  an X that also satisfies every rule (``Range``, ``Length``, ``OneOf``)

A failure raises ``SchemaError`` (a ValueError) whose message names the path of the bad value:
``steps[3].trace.scheduled[0].num_tokens: must be an integer >= 1, got -2``. Paths are built
only on failure (each container adds its segment while the error passes up), so decoding a
valid file costs no string formatting.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

MAX_INT = 2**53  # the largest integer every JSON reader represents exactly
_SHOWN = 60  # characters of a bad value quoted in a message

Decoder = Callable[[Any], Any]


class SchemaError(ValueError):
    """A value that does not match its field's annotation; ``path`` locates it in the document."""

    def __init__(self, problem: str, path: str = "") -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.problem = problem
        self.path = path

    def under(self, segment: str) -> "SchemaError":
        """The same error one level up: ``segment`` ("steps", "[3]", "trace") goes in front."""
        if not self.path:
            path = segment
        elif self.path.startswith("["):
            path = segment + self.path
        else:
            path = f"{segment}.{self.path}"
        return SchemaError(self.problem, path)


# -- rules that Annotated[...] attaches to a type --------------------------------------------

@dataclass(frozen=True)
class Range:
    """A number within [lo, hi] (``hi=None``: no upper bound other than the type's)."""

    lo: float
    hi: float | None = None

    def check(self, value: float) -> bool:
        return value >= self.lo and (self.hi is None or value <= self.hi)

    def describe(self) -> str:
        lo = _number(self.lo)
        return f">= {lo}" if self.hi is None else f"in {lo} .. {_number(self.hi)}"


@dataclass(frozen=True)
class Length:
    """A string or array with between ``lo`` and ``hi`` items (characters for a string)."""

    lo: int = 0
    hi: int | None = None

    def check(self, value: Any) -> bool:
        return len(value) >= self.lo and (self.hi is None or len(value) <= self.hi)

    def describe(self) -> str:
        if self.hi is None:
            return f"with at least {self.lo} characters/items"
        return f"with {self.lo} to {self.hi} characters/items"


@dataclass(frozen=True)
class OneOf:
    """Exactly one of ``values``."""

    values: tuple[Any, ...]

    def check(self, value: Any) -> bool:
        return value in self.values

    def describe(self) -> str:
        return "one of " + ", ".join(json.dumps(v) for v in self.values)


Rule = Union[Range, Length, OneOf]


@dataclass(frozen=True)
class Nested:
    """``Annotated[Mapping[str, Any], Nested(("speculative_config",))]``: an object whose values
    are JSON scalars or arrays of scalars (decoded to tuples, as the engine's config holds them:
    ``pipeline_layer_split``), and in which the named keys may also hold an object of those (one
    level: a nested config such as EngineConfig.speculative_config inside RunMeta.config)."""

    keys: tuple[str, ...]


def _nested_mapping(keys: frozenset[str]) -> Decoder:
    scalars = _array(_scalar)

    def scalar_or_scalars(x: Any) -> Any:
        return scalars(x) if type(x) is list else _scalar(x)
    values = _mapping(scalar_or_scalars)

    def value_or_values(x: Any) -> Any:
        return values(x) if type(x) is dict else scalar_or_scalars(x)
    return _mapping(scalar_or_scalars, {k: value_or_values for k in keys})


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def show(value: Any) -> str:
    """A bad value as the message quotes it: JSON spelling, shortened; containers by kind."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


def _fail(expected: str, value: Any) -> SchemaError:
    return SchemaError(f"must be {expected}, got {show(value)}")


# -- decoders per annotation ------------------------------------------------------------------

def _int(value: Any) -> int:
    if type(value) is not int or not -MAX_INT <= value <= MAX_INT:
        raise _fail("an integer", value)
    return value


def _float(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _fail("a finite number", value)
    return float(value)


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise _fail("true or false", value)
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise _fail("a string", value)
    return value


def _scalar(value: Any) -> Any:
    if value is None or type(value) in (str, bool):
        return value
    if (type(value) is int and -MAX_INT <= value <= MAX_INT) or (type(value) is float and math.isfinite(value)):
        return value
    raise _fail("a string, a finite number, true/false or null", value)


_BASIC: dict[Any, tuple[Decoder, str]] = {
    int: (_int, "an integer"), float: (_float, "a finite number"), bool: (_bool, "true or false"),
    str: (_str, "a string"), Any: (_scalar, "a JSON scalar"),
}


def describe(tp: Any) -> str:
    """What a value of annotation ``tp`` must be, in words ("an integer >= 1")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated and any(isinstance(r, Nested) for r in args[1:]):
        return "an object"
    if origin is typing.Annotated:
        return " ".join([describe(args[0]), *(rule.describe() for rule in args[1:])])
    if tp in _BASIC:
        return _BASIC[tp][1]
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(v) for v in args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(json.dumps(m.value) for m in tp)
    if origin in (Union, types.UnionType):
        return " or ".join(sorted(("null" if a is type(None) else describe(a) for a in args), key=lambda d: d != "null"))
    if origin is tuple:
        return "an array"
    if origin in (dict, Mapping):
        return "an object"
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return f"an object ({tp.__name__})"
    raise TypeError(f"schema: no rule for the annotation {tp!r}")


@functools.cache
def decoder(tp: Any, tagged: frozenset[type] = frozenset()) -> Decoder:
    """The decoding function for annotation ``tp`` (built once per annotation, then cached).

    ``tagged``: the dataclasses that carry a ``"_type"`` key naming their class.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated and any(isinstance(r, Nested) for r in args[1:]):
        return _nested_mapping(frozenset(k for r in args[1:] if isinstance(r, Nested) for k in r.keys))
    if origin is typing.Annotated:
        return _annotated(decoder(args[0], tagged), args[1:], describe(tp))
    if tp in _BASIC:
        return _BASIC[tp][0]
    if origin is typing.Literal:
        return _literal(args, describe(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp, describe(tp))
    if origin in (Union, types.UnionType):
        return _optional(tp, args, tagged)
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"schema: only tuple[X, ...] is supported, got {tp!r}")
        return _array(decoder(args[0], tagged))
    if origin in (dict, Mapping):
        if args[0] is not str:
            raise TypeError(f"schema: mapping keys must be str, got {tp!r}")
        return _mapping(decoder(args[1], tagged))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _record(tp, tagged)
    raise TypeError(f"schema: no rule for the annotation {tp!r}")


def _annotated(inner: Decoder, rules: tuple[Rule, ...], expected: str) -> Decoder:
    def decode_annotated(value: Any) -> Any:
        try:
            out = inner(value)
        except SchemaError as e:
            if e.path:  # the problem is inside a container: keep its own message
                raise
            raise _fail(expected, value) from None
        for rule in rules:
            if not rule.check(out):
                raise _fail(expected, value)
        return out
    return decode_annotated


def _literal(values: tuple[Any, ...], expected: str) -> Decoder:
    def decode_literal(value: Any) -> Any:
        if not any(type(value) is type(v) and value == v for v in values):
            raise _fail(expected, value)
        return value
    return decode_literal


def _enum(cls: type[enum.Enum], expected: str) -> Decoder:
    members = {(type(m.value), m.value): m for m in cls}  # keyed by type too: true is not 1

    def decode_enum(value: Any) -> Any:
        try:
            return members[(type(value), value)]
        except (KeyError, TypeError):  # TypeError: an unhashable value (an array, an object)
            raise _fail(expected, value) from None
    return decode_enum


def _optional(tp: Any, args: tuple[Any, ...], tagged: frozenset[type]) -> Decoder:
    rest = [a for a in args if a is not type(None)]
    if len(rest) != 1 or len(args) != 2:
        raise TypeError(f"schema: only X | None unions are supported, got {tp!r}")
    inner, expected = decoder(rest[0], tagged), describe(tp)

    def decode_optional(value: Any) -> Any:
        if value is None:
            return None
        try:
            return inner(value)
        except SchemaError as e:
            if e.path:
                raise
            raise _fail(expected, value) from None
    return decode_optional


def _array(item: Decoder) -> Decoder:
    def decode_array(value: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise _fail("an array", value)
        out = []
        for i, x in enumerate(value):
            try:
                out.append(item(x))
            except SchemaError as e:
                raise e.under(f"[{i}]") from None
        return tuple(out)
    return decode_array


def key_segment(key: str) -> str:
    """A mapping key as a path segment: ``static`` when it reads as a name, else ``["a b"]``."""
    return key if key.isidentifier() else f"[{show(key)}]"


def _mapping(item: Decoder, by_key: Mapping[str, Decoder] | None = None) -> Decoder:
    """An object whose values ``item`` decodes (``by_key[k]`` for the keys it names)."""
    special = by_key or {}

    def decode_mapping(value: Any) -> dict[str, Any]:
        if type(value) is not dict:
            raise _fail("an object", value)
        out = {}
        for k, x in value.items():
            try:
                out[k] = special.get(k, item)(x)
            except SchemaError as e:
                raise e.under(key_segment(k)) from None
        return out
    return decode_mapping


def _record(cls: type, tagged: frozenset[type]) -> Decoder:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = [(f.name, decoder(hints[f.name], tagged),
               f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
              for f in dataclasses.fields(cls) if f.init]
    names = {name for name, _, _ in fields}
    tag = cls.__name__ if cls in tagged else None

    def decode_record(value: Any) -> Any:
        if type(value) is not dict:
            raise _fail(f"an object ({cls.__name__})", value)
        if tag is not None and value.get("_type") != tag:
            raise SchemaError(f"must be tagged \"_type\": \"{tag}\", got {show(value.get('_type'))}",
                              "_type")
        extra = [k for k in value if k not in names and not (tag is not None and k == "_type")]
        if extra:
            raise SchemaError(f"unknown field in {cls.__name__} (expected {', '.join(sorted(names))})",
                              key_segment(str(extra[0])))
        kwargs = {}
        for name, decode, required in fields:
            if name not in value:
                if required:
                    raise SchemaError(f"missing (a {cls.__name__} needs it)", name)
                continue
            try:
                kwargs[name] = decode(value[name])
            except SchemaError as e:
                raise e.under(name) from None
        return cls(**kwargs)
    return decode_record


def decode(tp: Any, value: Any, tagged: frozenset[type] = frozenset()) -> Any:
    """``value`` (parsed JSON) as annotation ``tp``; a SchemaError names the first bad path."""
    return decoder(tp, tagged)(value)
