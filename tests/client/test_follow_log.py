"""follow_log, the resume recipe: reopen after a transport loss from the last seq seen."""

from __future__ import annotations

import contextlib

import pytest
from client.fake_server import FakeServer

from protocol.client import Client, ClientError, SSEEvent, follow_log
from protocol.errors import SessionNotFoundError

LOG = "/api/experimental/session/ses_1/log"


def frame(seq: int) -> bytes:
    return f'id: {seq}\nevent: session.x\ndata: {{"seq": {seq}}}\n\n'.encode()


SYNCED = b'event: log.synced\ndata: {"type": "log.synced"}\n\n'


class Backoff:
    """Records the attempts instead of sleeping."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    async def __call__(self, attempt: int) -> None:
        self.attempts.append(attempt)


async def test_resumes_after_a_lost_connection_from_the_last_seq(
    client: Client, fake: FakeServer
) -> None:
    fake.sse_sequence(
        "GET",
        LOG,
        [
            ([frame(1), frame(2), SYNCED], "abort"),
            # A server replaying too much: the duplicate is dropped.
            ([frame(2), SYNCED, frame(3)], "end"),
        ],
    )
    backoff = Backoff()

    async with contextlib.aclosing(follow_log(client.sessions, "ses_1", backoff=backoff)) as events:
        got = [(e.id, e.event) async for e in events]

    assert got == [
        (1, "session.x"),
        (2, "session.x"),
        (None, "log.synced"),
        (None, "log.synced"),
        (3, "session.x"),
    ]
    assert [r.query for r in fake.requests] == [
        (("after", "0"), ("follow", "true")),
        (("after", "2"), ("follow", "true")),
    ]
    assert backoff.attempts == [1]


async def test_starts_after_the_given_seq(client: Client, fake: FakeServer) -> None:
    fake.sse("GET", LOG, [frame(5)])

    got = [e async for e in follow_log(client.sessions, "ses_1", after=4, backoff=Backoff())]

    assert got == [SSEEvent(id=5, event="session.x", data={"seq": 5})]
    assert fake.last.query == (("after", "4"), ("follow", "true"))


async def test_gives_up_after_the_retries(client: Client, fake: FakeServer) -> None:
    fake.sse("GET", LOG, [], then="abort")
    backoff = Backoff()

    with pytest.raises(ClientError) as caught:
        async for _ in follow_log(client.sessions, "ses_1", retries=2, backoff=backoff):
            pass

    assert caught.value.reason == "transport"
    assert backoff.attempts == [1, 2]
    assert len(fake.requests) == 3


async def test_progress_resets_the_retry_count(client: Client, fake: FakeServer) -> None:
    fake.sse_sequence(
        "GET",
        LOG,
        [([frame(1)], "abort"), ([frame(2)], "abort"), ([frame(3)], "abort"), ([], "end")],
    )
    backoff = Backoff()

    got = [e.id async for e in follow_log(client.sessions, "ses_1", retries=1, backoff=backoff)]

    assert got == [1, 2, 3]
    assert backoff.attempts == [1, 1, 1]


async def test_a_declared_error_is_not_retried(client: Client, fake: FakeServer) -> None:
    fake.json(
        "GET",
        LOG,
        {"_tag": "SessionNotFoundError", "message": "gone", "sessionID": "ses_1"},
        status=404,
    )
    backoff = Backoff()

    with pytest.raises(SessionNotFoundError):
        async for _ in follow_log(client.sessions, "ses_1", backoff=backoff):
            pass

    assert backoff.attempts == []
