"""The seam between the drain and a model: :class:`Provider`."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from actors.llm._request import ModelRequest
from actors.llm._stream import StreamPart

__all__ = ["Provider"]


class Provider(Protocol):
    """Something that turns a :class:`ModelRequest` into a normalized stream."""

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        """Stream the model's answer to ``request``.

        Implementations are async generators. The stream ends with exactly one
        :class:`~actors.llm.Finish` or raises a :class:`~actors.llm.ProviderError`;
        all I/O happens while iterating, none when this is called.

        The result is a generator rather than any async iterator so that the
        consumer can close it (``contextlib.aclosing``) the moment it stops
        reading: an interrupt cancels the consuming task, and the provider's
        connection must be released then, not whenever the garbage collector
        finalizes the generator. Implementations therefore keep their cleanup
        in ``finally``/``async with`` blocks and never swallow
        :class:`asyncio.CancelledError` or :class:`GeneratorExit`.
        """
        ...
