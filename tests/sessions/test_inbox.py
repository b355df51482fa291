"""Admission, reconciliation, pending-input changes and promotion order."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from conftest import WakeRecorder

from actors.sessions import Sessions
from protocol import (
    ConflictError,
    InvalidCursorError,
    InvalidRequestError,
    MessageNotFoundError,
    SessionNotFoundError,
    SyntheticMessage,
    UserMessage,
)
from protocol.requests import FileInput, PromptInput, SyntheticInput
from storage import SQLiteStore


async def types_of(store: SQLiteStore, session_id: str) -> list[str]:
    return [r.type.rsplit(".", 1)[0] for r in await store.read(session_id, limit=10_000)]


async def test_prompt_is_admitted_durably_before_it_is_visible(
    sessions: Sessions, store: SQLiteStore, wakes: WakeRecorder
) -> None:
    s = await sessions.create()
    receipt = await sessions.prompt(s.id, PromptInput(text="inspect the tests"))
    assert receipt.id.startswith("msg_")
    assert (receipt.type, receipt.delivery, receipt.session_id) == ("user", "steer", s.id)
    assert receipt.payload == {"text": "inspect the tests"}
    assert await sessions.pending(s.id) == [receipt]
    assert (await sessions.messages(s.id)).data == ()
    assert await types_of(store, s.id) == ["session.created", "session.inbox.enqueued"]
    assert wakes.calls == [(s.id, "input")]


async def test_resume_false_records_without_waking(sessions: Sessions, wakes: WakeRecorder) -> None:
    s = await sessions.create()
    await sessions.prompt(s.id, PromptInput(text="later", resume=False))
    await sessions.synthetic(s.id, SyntheticInput(text="note", resume=False))
    assert len(await sessions.pending(s.id)) == 2
    assert wakes.calls == []


async def test_prompt_to_unknown_or_malformed_session(sessions: Sessions) -> None:
    with pytest.raises(SessionNotFoundError):
        await sessions.prompt("ses_missing", PromptInput(text="x"))
    with pytest.raises(InvalidRequestError):
        await sessions.prompt("nope", PromptInput(text="x"))


async def test_exact_retry_returns_the_first_admission(
    sessions: Sessions, store: SQLiteStore, wakes: WakeRecorder
) -> None:
    s = await sessions.create()
    first = await sessions.prompt(
        s.id, PromptInput(id="msg_retry", text="one", metadata={"a": 1}, delivery="queue")
    )
    again = await sessions.prompt(
        s.id, PromptInput(id="msg_retry", text="two", metadata={"b": 2}, delivery="steer")
    )
    assert again == first
    assert await types_of(store, s.id) == ["session.created", "session.inbox.enqueued"]
    # An exact retry with resume still wakes: the caller may be recovering.
    assert wakes.calls == [(s.id, "input"), (s.id, "input")]


async def test_retry_after_delivery_is_rebuilt_from_the_message(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()
    first = await sessions.prompt(s.id, PromptInput(id="msg_done", text="one", delivery="queue"))
    assert await sessions.promote(s.id, "input") == 1
    assert await sessions.pending(s.id) == []
    again = await sessions.prompt(s.id, PromptInput(id="msg_done", text="changed"))
    assert again == first
    assert (await types_of(store, s.id)).count("session.inbox.enqueued") == 1


async def test_synthetic_retry_after_delivery_ignores_payload(sessions: Sessions) -> None:
    s = await sessions.create()
    first = await sessions.synthetic(
        s.id, SyntheticInput(id="msg_syn", text="a", description="d", metadata={"k": 1})
    )
    await sessions.promote(s.id, "steer")
    again = await sessions.synthetic(s.id, SyntheticInput(id="msg_syn", text="b"))
    assert again == first


async def test_id_reuse_across_sessions_or_types_conflicts(sessions: Sessions) -> None:
    a = await sessions.create()
    b = await sessions.create()
    await sessions.prompt(a.id, PromptInput(id="msg_shared", text="x"))
    with pytest.raises(ConflictError):
        await sessions.prompt(b.id, PromptInput(id="msg_shared", text="x"))
    with pytest.raises(ConflictError):
        await sessions.synthetic(a.id, SyntheticInput(id="msg_shared", text="x"))
    await sessions.promote(a.id, "steer")
    # Still conflicts once the id lives in a's transcript.
    with pytest.raises(ConflictError):
        await sessions.prompt(b.id, PromptInput(id="msg_shared", text="x"))
    with pytest.raises(ConflictError):
        await sessions.synthetic(a.id, SyntheticInput(id="msg_shared", text="x"))


async def test_a_cancelled_id_may_be_admitted_again(sessions: Sessions, store: SQLiteStore) -> None:
    s = await sessions.create()
    await sessions.prompt(s.id, PromptInput(id="msg_again", text="first"))
    await sessions.cancel(s.id, "msg_again")
    await sessions.cancel(s.id, "msg_again")  # a second cancel: a no-op, like the first
    second = await sessions.prompt(s.id, PromptInput(id="msg_again", text="second"))
    assert second.payload == {"text": "second"}
    assert await types_of(store, s.id) == [
        "session.created",
        "session.inbox.enqueued",
        "session.inbox.cancelled",
        "session.inbox.enqueued",
    ]


async def test_cancel_checks_session_and_item(sessions: Sessions) -> None:
    a = await sessions.create()
    b = await sessions.create()
    item = await sessions.prompt(a.id, PromptInput(text="x"))
    with pytest.raises(SessionNotFoundError):
        await sessions.cancel("ses_missing", item.id)
    with pytest.raises(ConflictError):
        await sessions.cancel(b.id, item.id)  # not pending *there*
    with pytest.raises(ConflictError):
        await sessions.cancel(a.id, "msg_never")
    with pytest.raises(InvalidRequestError):
        await sessions.cancel(a.id, "ses_wrong")


async def test_change_delivery(sessions: Sessions, wakes: WakeRecorder) -> None:
    s = await sessions.create()
    item = await sessions.prompt(s.id, PromptInput(text="x", delivery="queue", resume=False))
    with pytest.raises(ConflictError):
        await sessions.change_delivery(s.id, item.id, "queue")
    await sessions.change_delivery(s.id, item.id, "steer")
    assert wakes.calls == [(s.id, "steer")]
    assert (await sessions.pending(s.id))[0].delivery == "steer"
    await sessions.change_delivery(s.id, item.id, "queue")
    assert wakes.calls == [(s.id, "steer")]  # queueing never wakes
    await sessions.promote(s.id, "input")
    with pytest.raises(ConflictError):
        await sessions.change_delivery(s.id, item.id, "steer")


async def test_queued_input_waits_for_the_idle_boundary(sessions: Sessions) -> None:
    s = await sessions.create()
    await sessions.prompt(s.id, PromptInput(text="q", delivery="queue"))
    assert await sessions.promote(s.id, "steer") == 0
    assert await sessions.promote(s.id, "input") == 1
    assert await sessions.promote(s.id, "input") == 0


async def test_steers_deliver_in_admission_order_before_queued(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()
    q1 = await sessions.prompt(s.id, PromptInput(text="q1", delivery="queue"))
    p1 = await sessions.prompt(s.id, PromptInput(text="p1"))
    q2 = await sessions.prompt(s.id, PromptInput(text="q2", delivery="queue"))
    s1 = await sessions.synthetic(s.id, SyntheticInput(text="s1"))
    # Input scope with steers pending: all steers, and no queued item.
    assert await sessions.promote(s.id, "input") == 2
    assert [i.id for i in await sessions.pending(s.id)] == [q1.id, q2.id]
    # Then exactly one queued item per idle boundary, oldest first.
    assert await sessions.promote(s.id, "input") == 1
    assert await sessions.promote(s.id, "input") == 1
    transcript = (await sessions.messages(s.id, order="asc")).data
    assert [m.id for m in transcript] == [p1.id, s1.id, q1.id, q2.id]
    assert isinstance(transcript[1], SyntheticMessage)
    assert [m.seq for m in transcript] == sorted(m.seq for m in transcript)
    # One promotion of two steers is one transaction: adjacent seqs, same created.
    delivered = [r for r in await store.read(s.id) if r.type == "session.inbox.delivered.1"]
    assert delivered[1].seq == delivered[0].seq + 1


async def test_delivery_stops_before_a_control_item(sessions: Sessions) -> None:
    s = await sessions.create()
    a = await sessions.prompt(s.id, PromptInput(text="a"))
    # A manual compaction request: a control item in the inbox.
    compaction = await sessions.compact(s.id, "msg_compact", "steer")
    assert (compaction.id, compaction.type) == ("msg_compact", "compaction")
    b = await sessions.prompt(s.id, PromptInput(text="b"))
    assert await sessions.promote(s.id, "steer") == 1
    assert [i.id for i in await sessions.pending(s.id)] == ["msg_compact", b.id]
    assert [m.id for m in (await sessions.messages(s.id)).data] == [a.id]
    # Nothing crosses the control item, at the idle boundary either.
    assert await sessions.promote(s.id, "input") == 0


async def test_delivered_message_shapes(sessions: Sessions) -> None:
    s = await sessions.create()
    receipt = await sessions.prompt(
        s.id, PromptInput(text="hello", metadata={"from": "test"}, delivery="queue")
    )
    await sessions.promote(s.id, "input")
    message = await sessions.message(s.id, receipt.id)
    assert isinstance(message, UserMessage)
    assert (message.text, message.metadata) == ("hello", {"from": "test"})
    assert message.time.created >= receipt.time_created
    assert await sessions.context(s.id) == [message]


async def test_message_lookup_never_discloses_other_sessions(sessions: Sessions) -> None:
    a = await sessions.create()
    b = await sessions.create()
    item = await sessions.prompt(a.id, PromptInput(text="secret"))
    await sessions.promote(a.id, "steer")
    with pytest.raises(MessageNotFoundError) as info:
        await sessions.message(b.id, item.id)
    assert info.value.to_wire() == {
        "_tag": "MessageNotFoundError",
        "message": f"Message not found: {item.id}",
        "sessionID": b.id,
        "messageID": item.id,
    }
    with pytest.raises(SessionNotFoundError):
        await sessions.message("ses_missing", item.id)


async def test_message_pages_round_trip(sessions: Sessions) -> None:
    s = await sessions.create()
    other = await sessions.create()
    for i in range(5):
        await sessions.prompt(s.id, PromptInput(text=str(i)))
    await sessions.promote(s.id, "steer")
    first = await sessions.messages(s.id, limit=2)
    assert [m.text for m in first.data] == ["4", "3"]  # type: ignore[union-attr]
    pages = [first]
    while pages[-1].cursor.next:
        pages.append(await sessions.messages(s.id, cursor=pages[-1].cursor.next))
    assert [m.text for p in pages for m in p.data] == ["4", "3", "2", "1", "0"]  # type: ignore[union-attr]
    back = await sessions.messages(s.id, cursor=pages[-1].cursor.previous)
    assert back.data == pages[-2].data
    assert first.cursor.next is not None
    with pytest.raises(InvalidCursorError):
        await sessions.messages(other.id, cursor=first.cursor.next)
    with pytest.raises(InvalidRequestError):
        await sessions.messages(s.id, limit=2, cursor=first.cursor.next)
    with pytest.raises(InvalidRequestError):
        await sessions.messages(s.id, limit=500)


async def test_files_are_materialised_at_admission(sessions: Sessions, tmp_path: Path) -> None:
    s = await sessions.create()
    attached = tmp_path / "notes.txt"
    attached.write_bytes(b"file body")
    inline = base64.b64encode(b"inline body").decode()
    receipt = await sessions.prompt(
        s.id,
        PromptInput(
            text="see files",
            files=(
                FileInput(uri=attached.as_uri(), mime="text/plain", name="notes.txt"),
                FileInput(data=inline, mime="text/plain"),
                FileInput(uri="data:text/plain;base64," + inline, mime="text/plain"),
            ),
        ),
    )
    files = receipt.payload["files"]
    assert base64.b64decode(files[0]["data"]) == b"file body"
    assert files[0]["source"] == {"type": "uri", "uri": attached.as_uri()}
    assert files[1]["source"] == {"type": "inline"}
    assert base64.b64decode(files[2]["data"]) == b"inline body"
    await sessions.promote(s.id, "steer")
    message = await sessions.message(s.id, receipt.id)
    assert isinstance(message, UserMessage)
    assert message.files is not None
    assert message.files[0].name == "notes.txt"


@pytest.mark.parametrize(
    "file",
    [
        FileInput(data="***not base64***", mime="text/plain"),
        FileInput(uri="https://example.invalid/x", mime="text/plain"),
        FileInput(uri="file:///definitely/not/here", mime="text/plain"),
        FileInput(uri="data:text/plain,plain", mime="text/plain"),
    ],
)
async def test_bad_files_are_refused_and_nothing_is_admitted(
    sessions: Sessions, file: FileInput
) -> None:
    s = await sessions.create()
    with pytest.raises(InvalidRequestError):
        await sessions.prompt(s.id, PromptInput(text="x", files=(file,)))
    assert await sessions.pending(s.id) == []


def test_a_file_needs_exactly_one_source() -> None:
    with pytest.raises(InvalidRequestError):
        FileInput(mime="text/plain")
    with pytest.raises(InvalidRequestError):
        FileInput(uri="file:///x", data="eA==", mime="text/plain")


async def test_inbox_of_unknown_session(sessions: Sessions) -> None:
    with pytest.raises(SessionNotFoundError):
        await sessions.pending("ses_missing")


async def test_deleting_a_session_drops_its_pending_input(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()
    await sessions.prompt(s.id, PromptInput(text="x"))
    await sessions.remove(s.id)
    rows = await store.fetch("SELECT count(*) FROM session_inbox")
    assert rows[0][0] == 0
    with pytest.raises(SessionNotFoundError):
        await sessions.prompt(s.id, PromptInput(text="y"))


async def test_metadata_that_json_cannot_hold_is_refused_up_front() -> None:
    with pytest.raises(InvalidRequestError) as info:
        PromptInput(text="x", metadata={"n": 2**80})
    assert info.value.fields["field"] == "metadata"


async def test_recorded_synthetic_messages_join_the_transcript_directly(
    sessions: Sessions, store: SQLiteStore
) -> None:
    from protocol import events as ev
    from storage import Command, ProjectionConflict

    s = await sessions.create()
    note = ev.SyntheticRecorded(
        session_id=s.id, message_id="msg_note", text="Continuing", description="restart"
    )
    await store.append(Command.of(note))
    [message] = await sessions.context(s.id)
    assert isinstance(message, SyntheticMessage)
    assert (message.id, message.text, message.description) == ("msg_note", "Continuing", "restart")
    # The id is taken: neither a second record nor a user prompt may reuse it.
    with pytest.raises(ProjectionConflict):
        await store.append(Command.of(note))
    with pytest.raises(ConflictError):
        await sessions.prompt(s.id, PromptInput(id="msg_note", text="x"))


async def test_retry_reconciliation_precedes_attachment_resolution(
    sessions: Sessions, tmp_path: Path, wakes: WakeRecorder
) -> None:
    s = await sessions.create()
    attached = tmp_path / "notes.txt"
    attached.write_bytes(b"file body")
    files = (FileInput(uri=attached.as_uri(), mime="text/plain"),)
    first = await sessions.prompt(s.id, PromptInput(id="msg_files", text="see", files=files))
    # The file is gone: reading it again would refuse the retry (400).
    attached.unlink()
    again = await sessions.prompt(s.id, PromptInput(id="msg_files", text="see", files=files))
    assert again == first
    await sessions.promote(s.id, "steer")
    delivered = await sessions.prompt(s.id, PromptInput(id="msg_files", text="see", files=files))
    assert delivered == first
    # A new id with the same files still reads them, and is refused.
    with pytest.raises(InvalidRequestError):
        await sessions.prompt(s.id, PromptInput(id="msg_fresh", text="see", files=files))
    assert wakes.calls == [(s.id, "input")] * 3
