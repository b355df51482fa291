"""Fork, view, generate and stats through a real runtime (SQLite file, scripted model)."""

from __future__ import annotations

from typing import Any

import pytest
from feed import Feed
from pgdb import stored_and_rebuilt

from actors.runtime import Runtime
from protocol import AssistantMessage, UserMessage
from protocol.errors import (
    InvalidRequestError,
    MessageNotFoundError,
    ServiceUnavailableError,
    SessionNotFoundError,
)
from protocol.requests import PromptInput
from protocol.shapes import ForkBoundary, SessionMessage, TextPart


async def transcript(rt: Runtime, session_id: str) -> list[SessionMessage]:
    return list((await rt.sessions.messages(session_id, order="asc", limit=200)).data)


def content(message: SessionMessage) -> Any:
    """A message without what a copy changes: its id, session and seq."""
    if isinstance(message, AssistantMessage):
        return ("assistant", message.parts, message.finish, message.tokens, message.cost)
    assert isinstance(message, UserMessage)
    return ("user", message.text)


async def two_turns(rt: Runtime, feed: Feed) -> tuple[str, list[SessionMessage]]:
    s = await rt.sessions.create()
    await rt.sessions.prompt(s.id, PromptInput(text="#text first answer\n#usage cost=0.5"))
    await rt.execution.wait_idle(s.id)
    await rt.sessions.prompt(s.id, PromptInput(text="#text second answer\n#usage cost=0.25"))
    await rt.execution.wait_idle(s.id)
    messages = await transcript(rt, s.id)
    assert [type(m).__name__ for m in messages] == [
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",
    ]
    return s.id, messages


async def replay_matches(rt: Runtime) -> None:
    stored, rebuilt = await stored_and_rebuilt(rt.store)
    assert stored == rebuilt


@pytest.mark.parametrize(
    ("boundary", "copied"),
    [("first", 0), ("middle", 2), ("absent", 4)],
)
async def test_a_fork_copies_the_transcript_through_its_boundary(
    runtime: Runtime, feed: Feed, boundary: str, copied: int
) -> None:
    parent_id, messages = await two_turns(runtime, feed)
    before = {"first": messages[0].id, "middle": messages[2].id, "absent": None}[boundary]
    child = await runtime.sessions.fork(parent_id, before)
    parent = await runtime.sessions.get(parent_id)

    assert child.id != parent_id
    assert child.parent_id is None  # independent: not deleted with its source
    assert child.fork_session_id == parent_id
    assert child.fork_boundary == (
        ForkBoundary(type="before", message_id=before)
        if before is not None
        else ForkBoundary(type="through", message_id=messages[-1].id)
    )
    assert child.title == f"{parent.title} (fork #1)"
    assert child.location == parent.location
    assert child.cost == 0.0  # what the copied steps cost was spent by the parent

    copies = await transcript(runtime, child.id)
    assert [content(m) for m in copies] == [content(m) for m in messages[:copied]]
    assert all(m.session_id == child.id for m in copies)
    assert not {m.id for m in copies} & {m.id for m in messages}
    seqs = [m.seq for m in copies]
    assert seqs == sorted(seqs)
    assert all(seq < 1 for seq in seqs)
    # The parent is untouched.
    assert await transcript(runtime, parent_id) == messages

    log = await runtime.store.read(child.id)
    assert [r.type for r in log] == ["session.forked.2", "session.renamed.1"]
    await replay_matches(runtime)


async def test_a_fork_is_independent_of_its_source(runtime: Runtime, feed: Feed) -> None:
    parent_id, messages = await two_turns(runtime, feed)
    child = await runtime.sessions.fork(parent_id)
    parent_log = len(await runtime.store.read(parent_id))

    await runtime.sessions.prompt(child.id, PromptInput(text="#text only in the fork"))
    await runtime.execution.wait_idle(child.id)
    forked = await transcript(runtime, child.id)
    assert len(forked) == 6
    last = forked[-1]
    assert isinstance(last, AssistantMessage)
    assert last.parts == (TextPart(ordinal=0, text="only in the fork"),)
    assert forked[4].seq > 0  # the child's own messages follow the copied ones
    assert await transcript(runtime, parent_id) == messages
    assert len(await runtime.store.read(parent_id)) == parent_log

    await runtime.sessions.prompt(parent_id, PromptInput(text="#text only in the parent"))
    await runtime.execution.wait_idle(parent_id)
    assert await transcript(runtime, child.id) == forked
    assert len(await transcript(runtime, parent_id)) == 6

    # A fork of a fork counts on; deleting the source leaves the fork alone.
    grandchild = await runtime.sessions.fork(child.id)
    assert grandchild.title.endswith("(fork #2)")
    await runtime.sessions.remove(parent_id)
    assert len(await transcript(runtime, child.id)) == 6
    await replay_matches(runtime)


async def test_a_fork_of_a_running_session_copies_only_settled_history(
    runtime: Runtime, feed: Feed
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text="#text done"))
    await runtime.execution.wait_idle(s.id)
    mark = len(feed.events)
    await runtime.sessions.prompt(
        s.id, PromptInput(text="#delay 50\n#chunk 1\n#text a slow answer still streaming")
    )
    await feed.wait("session.text.delta", after=mark, sessionID=s.id)
    child = await runtime.sessions.fork(s.id)
    assert s.id in await runtime.execution.active()

    copies = await transcript(runtime, child.id)
    # The settled turn and the delivered prompt; not the step still running.
    assert [type(m).__name__ for m in copies] == ["UserMessage", "AssistantMessage", "UserMessage"]
    await runtime.execution.wait_idle(s.id)
    parent = await transcript(runtime, s.id)
    assert len(parent) == 4
    final = parent[-1]
    assert isinstance(final, AssistantMessage)
    assert final.finish == "stop"
    # The parent's step finished at home; the fork never saw any of it.
    assert await transcript(runtime, child.id) == copies
    assert child.id not in await runtime.execution.active()
    await replay_matches(runtime)


async def test_fork_refusals(runtime: Runtime, feed: Feed) -> None:
    parent_id, _ = await two_turns(runtime, feed)
    other = await runtime.sessions.create()
    await runtime.sessions.prompt(other.id, PromptInput(text="elsewhere", resume=False))
    await runtime.sessions.promote(other.id, "steer")
    [foreign] = await transcript(runtime, other.id)
    with pytest.raises(MessageNotFoundError):
        await runtime.sessions.fork(parent_id, foreign.id)
    with pytest.raises(MessageNotFoundError):
        await runtime.sessions.fork(parent_id, "msg_unknown")
    with pytest.raises(InvalidRequestError):
        await runtime.sessions.fork(parent_id, "ses_not_a_message")
    with pytest.raises(SessionNotFoundError):
        await runtime.sessions.fork("ses_missing")


async def test_a_fork_of_an_empty_session_is_empty(runtime: Runtime) -> None:
    s = await runtime.sessions.create()
    child = await runtime.sessions.fork(s.id)
    assert child.fork_boundary == ForkBoundary(type="through")
    assert await transcript(runtime, child.id) == []
    await runtime.sessions.prompt(child.id, PromptInput(text="#text fresh"))
    await runtime.execution.wait_idle(child.id)
    assert len(await transcript(runtime, child.id)) == 2


async def test_view_marks_the_idle_transition_and_unread_returns(
    runtime: Runtime, feed: Feed
) -> None:
    s = await runtime.sessions.create()
    assert s.time.idle is None
    assert s.time.viewed is None
    await runtime.sessions.prompt(s.id, PromptInput(text="#text one"))
    await runtime.execution.wait_idle(s.id)
    idle = (await runtime.sessions.get(s.id)).time.idle
    assert idle is not None
    updated = (await runtime.sessions.get(s.id)).time.updated

    await runtime.sessions.view(s.id, idle)
    seen = await runtime.sessions.get(s.id)
    assert seen.time.viewed == idle
    assert seen.time.updated == updated  # seeing is not editing
    await runtime.sessions.view(s.id, idle - 1000)  # a stale view never regresses
    assert (await runtime.sessions.get(s.id)).time.viewed == idle

    await runtime.sessions.prompt(s.id, PromptInput(text="#text two"))
    await runtime.execution.wait_idle(s.id)
    again = await runtime.sessions.get(s.id)
    assert again.time.idle is not None
    assert again.time.viewed is not None
    assert again.time.idle > again.time.viewed  # unread again
    with pytest.raises(SessionNotFoundError):
        await runtime.sessions.view("ses_missing", 1)
    with pytest.raises(InvalidRequestError):
        await runtime.sessions.view(s.id, -1)
    await replay_matches(runtime)


async def test_generate_answers_from_the_session_and_changes_nothing(
    runtime: Runtime, feed: Feed
) -> None:
    parent_id, messages = await two_turns(runtime, feed)
    session = await runtime.sessions.get(parent_id)
    log = await runtime.store.read(parent_id)
    everything = await runtime.store.read_all(limit=10_000)

    generator = runtime.services.generator
    text = await generator.generate(parent_id, "#text a one-off answer")
    assert text == "a one-off answer"
    assert await generator.generate(parent_id, "what now?") == "Scripted reply: what now?"

    assert await runtime.store.read(parent_id) == log
    assert await runtime.store.read_all(limit=10_000) == everything
    assert await transcript(runtime, parent_id) == messages
    assert await runtime.sessions.get(parent_id) == session
    assert await runtime.sessions.pending(parent_id) == []

    with pytest.raises(ServiceUnavailableError):
        await generator.generate(parent_id, "#fail auth")
    with pytest.raises(InvalidRequestError):
        await generator.generate(parent_id, "  ")
    with pytest.raises(SessionNotFoundError):
        await generator.generate("ses_missing", "hello")
    assert await runtime.store.read_all(limit=10_000) == everything


async def test_stats_count_sessions_and_usage_by_model(runtime: Runtime, feed: Feed) -> None:
    empty = await runtime.transfer.stats()
    assert (empty.sessions, empty.forks, empty.cost, empty.models) == (0, 0, 0.0, ())

    parent_id, _ = await two_turns(runtime, feed)
    await runtime.sessions.create()
    await runtime.sessions.fork(parent_id)
    stats = await runtime.transfer.stats()
    assert stats.sessions == 3
    assert stats.forks == 1
    [model] = stats.models
    assert model.model is not None
    assert model.model.provider_id == "scripted"
    # The fork's copied steps are not counted twice.
    assert model.sessions == 1
    assert model.messages == 2
    parent = await runtime.sessions.get(parent_id)
    assert model.cost == pytest.approx(0.75) == pytest.approx(parent.cost)
    assert model.tokens == parent.tokens
    assert stats.tokens == parent.tokens
    assert stats.cost == pytest.approx(0.75)


async def test_a_fork_leaves_out_what_a_staged_revert_hides(runtime: Runtime, feed: Feed) -> None:
    parent_id, messages = await two_turns(runtime, feed)
    await runtime.reverts.stage(parent_id, messages[2].id, False)
    child = await runtime.sessions.fork(parent_id)
    assert child.fork_boundary == ForkBoundary(type="through", message_id=messages[1].id)
    assert [content(m) for m in await transcript(runtime, child.id)] == [
        content(m) for m in messages[:2]
    ]
    await replay_matches(runtime)
