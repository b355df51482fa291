"""The one JSON codec: attrs values <-> wire JSON, through orjson.

Python fields are snake_case; wire members are camelCase with ``ID`` kept
upper-case (``session_id`` <-> ``sessionID``, ``time_created`` <->
``timeCreated``). A field may override its wire name with
``attrs.field(metadata={"wire": "…"})``.

Fields whose value is ``None`` are left out on encode, and a missing optional
member decodes to the field's default. Decoding validates shapes and raises
:class:`~protocol.errors.InvalidRequestError` naming the offending member, so
the same code checks client input and reads stored data.

Supported field types: ``str``, ``int``, ``float``, ``bool``, ``X | None``,
``Literal[…]``, ``tuple[X, ...]``, ``Mapping[str, Any]`` / ``dict[str, Any]``
(a JSON object kept as is), ``Any`` (any JSON value), nested attrs classes and
unions of attrs classes told apart by a ``type`` member holding a Literal.
"""

from __future__ import annotations

import collections.abc
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import attrs
import orjson

from protocol.errors import InvalidRequestError

__all__ = ["dumps", "from_json", "loads", "to_json", "unknown_member", "wire_name"]

T = TypeVar("T")

_Encoder = Callable[[Any], Any]
_Decoder = Callable[[Any, str], Any]


def wire_name(name: str) -> str:
    """``assistant_message_id`` -> ``assistantMessageID``."""
    head, *rest = name.split("_")
    return head + "".join("ID" if part == "id" else part.capitalize() for part in rest)


def dumps(value: Any) -> bytes:
    """Encode an attrs value (or plain JSON data) to JSON bytes."""
    return orjson.dumps(to_json(value))


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"Malformed JSON: {exc}", kind="json") from None


def to_json(value: Any) -> Any:
    """Turn an attrs value into JSON-ready data; other values pass through."""
    # A class planned already costs one dict lookup, not attrs.has and a call;
    # JSON scalars and plain dicts (a prompt's payload, its text) are told by
    # their exact class before attrs.has, which costs more than either.
    cls = value.__class__
    plan = _PLANS.get(cls)
    if plan is not None:
        return plan.encode(value)
    if cls in _SCALARS:
        return value
    if cls is dict:
        return {k: to_json(v) for k, v in value.items()}
    if attrs.has(cls):
        return _plan(cls).encode(value)
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


#: Classes :func:`to_json` returns as they are, told by exact class.
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def from_json(cls: type[T], data: Any, *, path: str = "", strict: bool = False) -> T:
    """Decode JSON data into ``cls``, validating every member.

    ``strict`` (client input) also refuses members ``cls`` does not declare,
    at any depth, with a 400 naming the first one: a misspelt ``"delivry"``
    must not silently fall back to the default. Stored data and server
    replies decode leniently, so a newer writer's extra member is no error.
    """
    if strict:
        unknown = unknown_member(cls, data, path)
        if unknown is not None:
            raise InvalidRequestError(f"unknown field {unknown}", kind="unknown", field=unknown)
    decoded: T = _decoder_for(cls)(data, path)
    return decoded


def unknown_member(tp: Any, data: Any, path: str = "") -> str | None:
    """The path of the first member of ``data`` that type ``tp`` does not declare, or None.

    Only walks what has a declared shape (attrs classes, tuples and unions of
    them); ``Mapping``/``Any`` members are free-form by design. Values of the
    wrong type are left for the decoder to name. What each type declares is
    worked out once per type (:func:`_shape`), not at every request.
    """
    kind, arg = _shape(tp)
    if kind == "one":
        return unknown_member(arg, data, path)
    if kind == "union":
        tag = data.get("type") if isinstance(data, dict) else None
        if isinstance(tag, str):  # tags are strings; a list there must not raise here
            option = _tagged(tp).get(tag)
            if option is not None:
                return unknown_member(option, data, path)
        return None
    if kind == "tuple":
        if isinstance(data, list):
            for i, value in enumerate(data):
                found = unknown_member(arg, value, f"{path}[{i}]")
                if found is not None:
                    return found
        return None
    if kind != "attrs" or not isinstance(data, dict):
        return None
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        hint = arg.get(key, _UNDECLARED)
        if hint is _UNDECLARED:
            return sub
        found = unknown_member(hint, value, sub)
        if found is not None:
            return found
    return None


_UNDECLARED: Any = object()


@functools.cache
def _shape(tp: Any) -> tuple[str, Any]:
    """What :func:`unknown_member` walks in ``tp``: ("one", the union's one option),
    ("union", None), ("tuple", item type), ("attrs", wire name -> type) or ("free", None)."""
    if _is_union(tp):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return "one", options[0]
        return "union", None
    if typing.get_origin(tp) is tuple:
        return "tuple", typing.get_args(tp)[0]
    if isinstance(tp, type) and attrs.has(tp):
        hints = _hints(tp)
        return "attrs", {f.wire: hints[f.name] for f in _plan(tp).fields}
    return "free", None


@functools.cache
def _tagged(tp: Any) -> dict[Any, Any]:
    """A union's options by their ``type`` tag (the first option naming a tag wins)."""
    out: dict[Any, Any] = {}
    for option in typing.get_args(tp):
        if not (isinstance(option, type) and attrs.has(option)):
            continue  # only an attrs class declares a tag (``list[str]`` has no hints at all)
        tag_type = _hints(option).get("type")
        for tag in typing.get_args(tag_type):
            out.setdefault(tag, option)
    return out


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# -- plans -------------------------------------------------------------------------------------


@attrs.frozen
class _Field:
    name: str
    wire: str
    encode: _Encoder
    decode: _Decoder
    required: bool
    #: A required ``Any`` field: JSON ``null`` is a value there, kept both ways.
    nullable: bool = False
    #: For a type whose valid values decode as themselves (strings, integers,
    #: booleans, literals, objects kept as they are, any JSON): the validity
    #: test, which spares the decoder call and its member path; a value that
    #: fails it goes to the decoder, which says why.
    leaf: Callable[[Any], bool] | None = None
    #: Encodes as itself (``encode`` is the identity): the call is skipped.
    plain: bool = False


@attrs.frozen
class _Plan:
    cls: type[Any]
    fields: tuple[_Field, ...]

    def encode(self, value: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.fields:
            v = getattr(value, f.name)
            if v is not None:
                out[f.wire] = v if f.plain else f.encode(v)
            elif f.nullable:
                out[f.wire] = None
        return out

    def decode(self, data: Any, path: str) -> Any:
        if not isinstance(data, dict):
            raise _invalid(path, "an object")
        kwargs: dict[str, Any] = {}
        for f in self.fields:
            raw = data.get(f.wire)
            if raw is None:
                if f.nullable and f.wire in data:
                    kwargs[f.name] = None
                    continue
                if f.required:
                    sub = f"{path}.{f.wire}" if path else f.wire
                    raise InvalidRequestError(f"{sub} is required", kind="missing", field=sub)
                continue
            leaf = f.leaf
            if leaf is not None and leaf(raw):
                kwargs[f.name] = raw
            else:
                kwargs[f.name] = f.decode(raw, f"{path}.{f.wire}" if path else f.wire)
        try:
            return self.cls(**kwargs)
        except InvalidRequestError:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"{path or 'body'}: {exc}", field=path or None) from None


#: Each attrs class -> its plan, made on first use. Bounded by the attrs
#: classes defined in code.
_PLANS: dict[type[Any], _Plan] = {}


def _plan(cls: type[Any]) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _make_plan(cls)
    return plan


def _make_plan(cls: type[Any]) -> _Plan:
    hints = typing.get_type_hints(cls)
    fields = []
    for a in attrs.fields(cls):
        if not a.init:
            continue
        tp = hints[a.name]
        encode, decode = _codec_for(tp)
        fields.append(
            _Field(
                name=a.name,
                wire=a.metadata.get("wire", wire_name(a.name)),
                encode=encode,
                decode=decode,
                required=a.default is attrs.NOTHING and not _is_optional(tp),
                nullable=tp is Any and a.default is attrs.NOTHING,
                leaf=_leaf_test(tp),
                plain=encode is _identity,
            )
        )
    return _Plan(cls=cls, fields=tuple(fields))


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_object(v: Any) -> bool:
    return isinstance(v, dict)


def _is_anything(v: Any) -> bool:
    return True


@functools.cache
def _leaf_test(tp: Any) -> Callable[[Any], bool] | None:
    """The validity test of a type whose decoder returns a valid value as it is
    (see :attr:`_Field.leaf`); None for one that builds or converts (attrs
    classes, tuples, floats from integers)."""
    if tp is Any:
        return _is_anything
    if _is_union(tp):
        options = tuple(a for a in typing.get_args(tp) if a is not type(None))
        return _leaf_test(options[0]) if len(options) == 1 else None
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)  # a tuple: any value can be looked for
        return lambda v: v in allowed
    if origin in (dict, collections.abc.Mapping) or tp in (dict, Mapping):
        return _is_object
    return {str: _is_str, int: _is_int, bool: _is_bool}.get(tp)


def _is_optional(tp: Any) -> bool:
    return _is_union(tp) and type(None) in typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _identity(v: Any) -> Any:
    return v


def _any_json(v: Any, path: str) -> Any:
    return v


def _undecodable(v: Any, path: str) -> Any:
    raise TypeError(f"codec: cannot decode a generic member at {path!r}")


def _invalid(path: str, expected: str) -> InvalidRequestError:
    where = path or "body"
    return InvalidRequestError(f"{where} must be {expected}", kind="type", field=path or None)


def _decoder_for(tp: Any) -> _Decoder:
    return _codec_for(tp)[1]


@functools.cache
def _codec_for(tp: Any) -> tuple[_Encoder, _Decoder]:
    if tp is Any:
        return _identity, _any_json
    if isinstance(tp, TypeVar):
        # Generic containers (Page[T]) encode their items by their runtime type;
        # decoding needs the concrete class, so Page decodes by hand.
        return to_json, _undecodable
    if attrs.has(tp):
        plan = _plan(tp)
        return plan.encode, plan.decode
    origin = typing.get_origin(tp)
    if _is_union(tp):
        return _union_codec(tuple(a for a in typing.get_args(tp) if a is not type(None)))
    if origin is typing.Literal:
        allowed = typing.get_args(tp)

        def decode_literal(v: Any, path: str) -> Any:
            if v not in allowed:
                raise InvalidRequestError(
                    f"{path or 'value'} must be one of {', '.join(map(str, allowed))}",
                    kind="enum",
                    field=path or None,
                )
            return v

        return _identity, decode_literal
    if origin is tuple:
        item_encode, item_decode = _codec_for(typing.get_args(tp)[0])

        def encode_tuple(v: Any) -> Any:
            return [item_encode(x) for x in v]

        def decode_tuple(v: Any, path: str) -> Any:
            if not isinstance(v, list):
                raise _invalid(path, "an array")
            return tuple(item_decode(x, f"{path}[{i}]") for i, x in enumerate(v))

        return encode_tuple, decode_tuple
    if origin in (dict, collections.abc.Mapping) or tp in (dict, Mapping):
        return _identity, _scalar(_is_object, "an object")
    if tp is bool:
        return _identity, _scalar(_is_bool, "a boolean")
    if tp is int:
        return _identity, _decode_int
    if tp is float:

        def decode_float(v: Any, path: str) -> Any:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise _invalid(path, "a number")
            return float(v)

        return _identity, decode_float
    if tp is str:
        return _identity, _scalar(_is_str, "a string")
    raise TypeError(f"codec: unsupported field type {tp!r}")


def _decode_int(v: Any, path: str) -> Any:
    # JSON Schema counts 2.3e7 as an integer (a number without a fraction): so do we.
    if isinstance(v, float) and v.is_integer() and -(2**63) <= v < 2**63:
        return int(v)
    if not _is_int(v):
        raise _invalid(path, "an integer")
    return v


def _scalar(check: Callable[[Any], bool], expected: str) -> _Decoder:
    def decode(v: Any, path: str) -> Any:
        if not check(v):
            raise _invalid(path, expected)
        return v

    return decode


def _union_codec(options: tuple[Any, ...]) -> tuple[_Encoder, _Decoder]:
    if len(options) == 1:
        return _codec_for(options[0])
    if not all(attrs.has(o) for o in options):
        raise TypeError(f"codec: only unions of attrs classes are supported, got {options!r}")
    by_tag: dict[str, Any] = {}
    for option in options:
        tag_type = typing.get_type_hints(option).get("type")
        if typing.get_origin(tag_type) is not typing.Literal:
            raise TypeError(f"codec: {option!r} needs a Literal 'type' field to sit in a union")
        for tag in typing.get_args(tag_type):
            by_tag[tag] = option

    def encode(v: Any) -> Any:
        return _plan(type(v)).encode(v)

    def decode(v: Any, path: str) -> Any:
        if not isinstance(v, dict):
            raise _invalid(path, "an object")
        option = by_tag.get(str(v.get("type")))
        if option is None:
            sub = f"{path}.type" if path else "type"
            raise InvalidRequestError(
                f"{sub} must be one of {', '.join(by_tag)}", kind="enum", field=sub
            )
        return _plan(option).decode(v, path)

    return encode, decode
