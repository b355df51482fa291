"""Inputs of the session operations, as clients send them.

These are decoded with :func:`protocol.codec.from_json`, which validates
types; the checks that need more than a type (id prefixes, base64, exactly
one of ``uri``/``data``) live in validators here so every entry point, HTTP or
in-process, applies them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from protocol import ids
from protocol.errors import InvalidRequestError
from protocol.shapes import Delivery, Location, ModelRef

__all__ = [
    "CompactInput",
    "CreateSessionInput",
    "FileInput",
    "ForkInput",
    "GenerateInput",
    "MoveInput",
    "PromptInput",
    "SyntheticInput",
    "UpdateSessionInput",
    "ViewInput",
]


def _id_of(kind: ids.IdKind, field: str) -> Any:
    def check(_instance: object, _attribute: object, value: str | None) -> None:
        if value is not None:
            ids.validate(kind, value, field=field)

    return check


def _id_field(kind: ids.IdKind, field: str) -> Any:
    """An optional client-chosen id: validated, and documented with its pattern."""
    return attrs.field(
        default=None,
        validator=_id_of(kind, field),
        metadata={"schema": {"type": "string", "pattern": ids.pattern(kind)}},
    )


def _json(field: str) -> Any:
    """Values must survive our JSON codec (e.g. integers within 64 bits)."""

    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is None:
            return
        try:
            orjson.dumps(value)
        except TypeError as exc:
            raise InvalidRequestError(
                f"{field} is not encodable as JSON: {exc}", kind="type", field=field
            ) from None

    return check


def _metadata() -> Any:
    return attrs.field(default=None, validator=_json("metadata"))


@attrs.frozen(kw_only=True)
class FileInput:
    """An attachment: a ``uri`` (``file://`` or ``data:``) or inline base64 ``data``."""

    uri: str | None = None
    data: str | None = None
    mime: str
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        if (self.uri is None) == (self.data is None):
            raise InvalidRequestError(
                "a file needs exactly one of uri or data", kind="file", field="files"
            )


@attrs.frozen(kw_only=True)
class PromptInput:
    id: str | None = _id_field("msg", "id")
    text: str
    files: tuple[FileInput, ...] | None = None
    metadata: Mapping[str, Any] | None = _metadata()
    delivery: Delivery = "steer"
    resume: bool = True


@attrs.frozen(kw_only=True)
class SyntheticInput:
    id: str | None = _id_field("msg", "id")
    text: str
    description: str | None = None
    metadata: Mapping[str, Any] | None = _metadata()
    delivery: Delivery = "steer"
    resume: bool = True


@attrs.frozen(kw_only=True)
class CompactInput:
    """A manual compaction request: a control item with its own id and delivery."""

    id: str | None = _id_field("msg", "id")
    delivery: Delivery = "steer"


@attrs.frozen(kw_only=True)
class MoveInput:
    """Move the session to another Location: a control item with its own delivery.

    The body is the public Location's fields (``directory``) and ``delivery``.
    """

    directory: str
    delivery: Delivery = "steer"


@attrs.frozen(kw_only=True)
class CreateSessionInput:
    id: str | None = _id_field("ses", "id")
    parent_id: str | None = _id_field("ses", "parentID")
    title: str | None = None
    agent: str | None = attrs.field(
        default=None, metadata={"schema": {"type": "string", "minLength": 1}}
    )
    model: ModelRef | None = None
    location: Location | None = None
    metadata: Mapping[str, Any] | None = _metadata()


@attrs.frozen(kw_only=True)
class UpdateSessionInput:
    title: str | None = None
    metadata: Mapping[str, Any] | None = _metadata()


@attrs.frozen(kw_only=True)
class ForkInput:
    #: Copy the messages before this one; absent: copy everything.
    before: str | None = _id_field("msg", "before")


@attrs.frozen(kw_only=True)
class ViewInput:
    #: The idle transition (``time.idle``, epoch ms) the client showed.
    idle: int = attrs.field(metadata={"schema": {"type": "integer", "minimum": 0}})


@attrs.frozen(kw_only=True)
class GenerateInput:
    prompt: str = attrs.field(metadata={"schema": {"type": "string", "pattern": "\\S"}})
