"""The base of the generated operation groups: one way to call, one way to stream.

Generated methods (``protocol/_generated_client.py``) only name the operation
and hand over their arguments; method, path, output decoding and errors come
from the :class:`~protocol.operations.Operation` itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from protocol._client_http import (
    CallOptions,
    ClientError,
    Connection,
    read_failure,
    read_success,
    transport_error,
)
from protocol._client_stream import EventStream
from protocol.lifecycle import LifecycleState
from protocol.operations import Operation

__all__ = ["APIGroup"]

_JSON: Final = "application/json"


class APIGroup:
    """Operations of one capability group (``client.sessions``, ``client.events``)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def _call(
        self,
        op: Operation,
        *,
        path_params: Mapping[str, str] | None = None,
        query: object = None,
        body: object = None,
        options: CallOptions | None = None,
    ) -> Any:
        """Send one request and decode its answer per ``op.output_kind``.

        Raises the server's :class:`~protocol.errors.DomainError`, or
        :class:`~protocol.client.ClientError`.
        """
        connection = self._connection
        try:
            async with asyncio.timeout(connection.deadline(options)):
                response = await connection.send(
                    op,
                    path_params=path_params or {},
                    query=query,
                    body=body,
                    options=options,
                    accept=_JSON,
                )
                try:
                    if 200 <= response.status < 300:
                        result = await read_success(op, response)
                    else:
                        raise await read_failure(op, response)
                except BaseException:
                    # Cancelled or failed mid-body: the connection cannot be reused.
                    response.close()
                    raise
                response.release()
                return result
        except TimeoutError as exc:
            raise transport_error(op, exc) from None
        except ClientError as exc:
            if exc.reason == "transport" and connection.state is LifecycleState.CLOSED:
                # The client closed under this call: that, not the broken socket, is the news.
                raise ClientError(
                    "closed", f"{op.id}: the client was closed", operation=op.id
                ) from exc
            raise

    def _stream(
        self,
        op: Operation,
        *,
        path_params: Mapping[str, str] | None = None,
        query: object = None,
        last_event_id: int | None = None,
        options: CallOptions | None = None,
    ) -> EventStream:
        """A cold stream: nothing is sent until the first ``__anext__``.

        ``last_event_id`` is sent as the SSE ``Last-Event-ID`` header.
        """
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        return EventStream(
            self._connection,
            op,
            path_params=path_params,
            query=query,
            headers=headers,
            options=options,
        )
