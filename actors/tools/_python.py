"""Python functions as tools: the :func:`tool` decorator for embedding applications.

::

    @tool
    async def lookup(ctx: CallContext, order: int, fields: list[str] | None = None) -> dict:
        '''Look an order up in the shop's database.'''
        ...

    async with Embedded(data_dir="./data", tools=[lookup]) as oc: ...

The decorated function becomes a :class:`FunctionTool`: its name is the
function's, its description the docstring, and its input schema is derived
from the annotations once, when it is decorated, so a parameter the model
could not fill in (no annotation, an unsupported type, ``*args``) fails at
start-up with :class:`ToolSchemaError`, never on the model's first call. A
registry checks the schema once more when the runtime starts.

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``,
``Any``; ``list[X]``, ``tuple[X, ...]``, ``Sequence[X]``, ``set[X]``;
``dict[str, X]``, ``Mapping[str, X]``; ``Literal[...]``; unions (``X | None``);
``attrs`` classes and ``TypedDict`` classes (objects with named fields);
``Annotated[X, "text"]`` adds a description. A parameter with a default is
optional. A parameter annotated :class:`CallContext` is not part of the
schema: it receives the call's context.

A call runs like any other tool's (permissions, ``tool.called`` first, one
terminal, bounding, cancellation): a sync function on the call's own worker
thread; an async one as a task on the runtime's event loop (it holds no
thread while it waits, and must not block), cancelled (``CancelledError``
inside it) when the call is interrupted.
The return value is the result: a ``str`` is the text the model sees, a
:class:`~actors.tools.ToolResult` is taken as is, anything else (attrs
instances included) is the structured result, shown to the model as JSON.
Raise :class:`~actors.tools.ToolError` to fail with a tag of your own; any
other exception fails the call as ``tool.error``.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, overload

import attrs

from actors.tools._types import ToolContext, ToolError, ToolResult

__all__ = ["CallContext", "FunctionTool", "ToolSchemaError", "tool"]

#: What providers accept as a function name (OpenAI's and Anthropic's rule).
_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolSchemaError(TypeError):
    """A function cannot be a tool: its name, docstring or an annotation says why."""


@attrs.frozen(kw_only=True)
class CallContext:
    """What a Python tool may know about its call, and how it reports back.

    ``progress(...)`` publishes live progress metadata for the call (never
    stored); ``cancelled`` is true once the call was interrupted: a long sync
    tool polls it (or calls :meth:`check`) and stops. An async tool is also
    cancelled outright.
    """

    session_id: str
    call_id: str
    #: The session's Location (its directory), absolute.
    location: Path
    _tool: ToolContext = attrs.field(alias="tool", repr=False)

    @property
    def cancelled(self) -> bool:
        return self._tool.cancel.is_set()

    def check(self) -> None:
        """Raise ``ToolError(type="aborted")`` if the call was interrupted."""
        if self.cancelled:
            raise ToolError("Tool execution aborted", type="aborted")

    def progress(self, **metadata: Any) -> None:
        """Report progress (JSON values); any thread, the loop included."""
        self._tool.progress(metadata)


@attrs.frozen
class _Param:
    name: str
    annotation: Any


class FunctionTool:
    """A typed Python function as a :class:`~actors.tools.Tool` (see :func:`tool`)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.fn = fn
        self._name: str = name or str(getattr(fn, "__name__", ""))
        where = f"tool {self._name!r}"
        if not _NAME.match(self._name):
            raise ToolSchemaError(f"{where}: a tool name is 1-64 letters, digits, '_' or '-'")
        doc = description if description is not None else inspect.getdoc(fn)
        if not doc or not doc.strip():
            raise ToolSchemaError(f"{where}: needs a docstring (the model reads it)")
        self._description = doc.strip()
        self._async = inspect.iscoroutinefunction(fn)
        self._context: str | None = None
        self._params: list[_Param] = []
        self._schema = self._derive(where)

    def __repr__(self) -> str:
        return f"<FunctionTool {self._name}>"

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return self._description

    @property
    def input_schema(self) -> Mapping[str, Any]:
        return self._schema

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself stays callable."""
        return self.fn(*args, **kwargs)

    def _derive(self, where: str) -> dict[str, Any]:
        try:
            hints = typing.get_type_hints(self.fn, include_extras=True)
        except Exception as exc:
            raise ToolSchemaError(f"{where}: cannot read its annotations: {exc}") from None
        properties: dict[str, Any] = {}
        required: list[str] = []
        for p in inspect.signature(self.fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ToolSchemaError(f"{where}: *{p.name} cannot be filled in by a model")
            if p.name not in hints:
                raise ToolSchemaError(f"{where}: parameter {p.name!r} has no annotation")
            annotation = hints[p.name]
            if annotation is CallContext:
                self._context = p.name
                continue
            schema = _schema(annotation, f"{where}: parameter {p.name!r}")
            if p.default is p.empty:
                required.append(p.name)
            elif _is_json(p.default):
                schema = {**schema, "default": p.default}
            properties[p.name] = schema
            self._params.append(_Param(p.name, annotation))
        out: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }
        if required:
            out["required"] = required
        return out

    @property
    def is_async(self) -> bool:
        """An async function: the executor awaits :meth:`arun` on the loop, no thread."""
        return self._async

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        if self._async:
            raise ToolError(f"{self._name} is async: it runs on the event loop (arun)")
        return _result(self.fn(**self._arguments(input, ctx)))

    async def arun(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        if not self._async:
            raise ToolError(f"{self._name} is not async: it runs on a worker thread (run)")
        return _result(await self.fn(**self._arguments(input, ctx)))

    def _arguments(self, input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
        kwargs = {
            p.name: _convert(p.annotation, input[p.name]) for p in self._params if p.name in input
        }
        if self._context is not None:
            kwargs[self._context] = CallContext(
                session_id=ctx.session_id,
                call_id=ctx.call_id,
                location=ctx.directory,
                tool=ctx,
            )
        return kwargs


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make ``fn`` (sync or async) a tool; ``@tool`` or ``@tool(name=…, description=…)``.

    Raises:
        ToolSchemaError: the name, the docstring or an annotation cannot make a tool.
    """
    if fn is not None:
        return FunctionTool(fn, name=name, description=description)

    def decorate(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description)

    return decorate


_PRIMITIVES: Final[Mapping[Any, Mapping[str, Any]]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}
_LISTS: Final = (list, tuple, set, frozenset, Sequence, typing.Sequence)
_MAPS: Final = (dict, Mapping, typing.Mapping)


def _schema(tp: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of annotation ``tp``; ``where`` names it in an error."""
    primitive = _primitive(tp)
    if primitive is not None:
        return primitive
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        inner = _schema(args[0], where)
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**inner, "description": " ".join(notes)} if notes else inner
    if origin is Literal:
        if not all(isinstance(a, str | int | float | bool) or a is None for a in args):
            raise ToolSchemaError(f"{where}: Literal values must be JSON scalars")
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema(a, where) for a in args]}
    if origin in _LISTS or tp in _LISTS:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if not args:
                return {"type": "array"}
            items = [_schema(a, where) for a in args]
            return {
                "type": "array",
                "prefixItems": items,
                "minItems": len(items),
                "maxItems": len(items),
            }
        out: dict[str, Any] = {"type": "array"}
        if args:
            out["items"] = _schema(args[0], where)
        if origin in (set, frozenset):
            out["uniqueItems"] = True
        return out
    if origin in _MAPS or tp in _MAPS:
        if args and args[0] is not str:
            raise ToolSchemaError(f"{where}: JSON object keys are strings, not {args[0]!r}")
        obj: dict[str, Any] = {"type": "object"}
        if len(args) == 2:
            obj["additionalProperties"] = _schema(args[1], where)
        return obj
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if isinstance(tp, type) and attrs.has(tp):
        return _object(tp, where)
    if typing.is_typeddict(tp):
        return _typeddict(tp, where)
    raise ToolSchemaError(f"{where}: unsupported annotation {tp!r}")


def _primitive(tp: Any) -> dict[str, Any] | None:
    try:
        found = _PRIMITIVES.get(tp)
    except TypeError:  # unhashable (Annotated with a dict, say)
        return None
    return None if found is None else dict(found)


def _object(cls: type, where: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        key = field.alias or field.name
        if field.name not in hints:
            raise ToolSchemaError(f"{where}: {cls.__name__}.{field.name} has no annotation")
        properties[key] = _schema(hints[field.name], f"{where} ({cls.__name__}.{field.name})")
        if field.default is attrs.NOTHING:
            required.append(key)
    out: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        out["required"] = required
    return out


def _typeddict(cls: Any, where: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    properties = {
        key: _schema(hint, f"{where} ({cls.__name__}.{key})") for key, hint in hints.items()
    }
    out: dict[str, Any] = {"type": "object", "properties": properties}
    required = [k for k in hints if k in cls.__required_keys__]
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    return out


def _convert(tp: Any, value: Any) -> Any:
    """A validated JSON value as the annotation's Python value (attrs instances built)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _convert(args[0], value)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if _fits(arg, value):
                return _convert(arg, value)
        return value
    if isinstance(value, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return tuple(_convert(a, v) for a, v in zip(args, value, strict=False))
        item = args[0] if args else Any
        items = [_convert(item, v) for v in value]
        if origin is tuple:
            return tuple(items)
        if origin in (set, frozenset):
            return origin(items)
        return items
    if isinstance(value, dict):
        if isinstance(tp, type) and attrs.has(tp):
            hints = typing.get_type_hints(tp, include_extras=True)
            by_key = {(f.alias or f.name): f for f in attrs.fields(tp) if f.init}
            built = {
                k: _convert(hints.get(by_key[k].name, Any), v)
                for k, v in value.items()
                if k in by_key
            }
            return tp(**built)
        if typing.is_typeddict(tp):
            hints = typing.get_type_hints(tp, include_extras=True)
            return {k: _convert(hints.get(k, Any), v) for k, v in value.items()}
        if len(args) == 2:
            return {k: _convert(args[1], v) for k, v in value.items()}
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _fits(tp: Any, value: Any) -> bool:
    """Whether JSON ``value`` is of the union member ``tp`` (first fit wins)."""
    origin = typing.get_origin(tp) or tp
    if origin is typing.Annotated:
        return _fits(typing.get_args(tp)[0], value)
    if tp is Any:
        return True
    if value is None:
        return tp is type(None)
    if origin is Literal:
        return value in typing.get_args(tp)
    if isinstance(value, bool):
        return origin is bool
    if isinstance(value, int):
        return origin in (int, float)
    if isinstance(value, float):
        return origin is float
    if isinstance(value, str):
        return origin is str or (isinstance(origin, type) and issubclass(origin, enum.Enum))
    if isinstance(value, list):
        return origin in _LISTS
    if isinstance(value, dict):
        return (
            origin in _MAPS or typing.is_typeddict(tp) or (isinstance(tp, type) and attrs.has(tp))
        )
    return False


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list | tuple):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _result(value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult.text(value)
    if value is None:
        return ToolResult.text("")
    return ToolResult(structured=_jsonable(value))


def _jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return _jsonable(attrs.asdict(value, recurse=False))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, Path):
        return str(value)
    return value
