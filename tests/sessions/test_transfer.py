"""Export and import: a session document survives the round trip (Hypothesis-generated sessions)."""

from __future__ import annotations

import asyncio
import base64
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.files.locations import DirectoryRules
from actors.sessions import Sessions
from actors.transfer import SessionTransfer
from protocol import codec
from protocol import events as ev
from protocol.errors import ConflictError, InvalidRequestError, SessionNotFoundError
from protocol.requests import CreateSessionInput, FileInput, PromptInput, SyntheticInput
from protocol.shapes import AssistantMessage, ModelRef, SessionExport, ToolPart, UserMessage
from storage import Command, SQLiteStore, rebuild_projections

words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=16)
small = st.integers(min_value=0, max_value=10_000)
metadata = st.one_of(st.none(), st.dictionaries(st.text(max_size=4), small, max_size=2))

user = st.tuples(
    st.just("user"),
    words,
    st.lists(st.binary(min_size=1, max_size=24), max_size=2),
    metadata,
)
synthetic = st.tuples(st.just("synthetic"), words, st.one_of(st.none(), words))
part = st.one_of(
    st.tuples(st.just("text"), words),
    st.tuples(st.just("reasoning"), words),
    st.tuples(
        st.just("tool"),
        st.sampled_from(["read", "bash"]),
        st.dictionaries(st.text(max_size=4), words, max_size=2),
        st.booleans(),
        words,
    ),
)
assistant = st.tuples(
    st.just("assistant"),
    st.lists(part, max_size=4),
    st.sampled_from(["stop", "tool-calls", "length", None]),
    st.tuples(small, small, small, small, small),
    st.floats(min_value=0, max_value=5, allow_nan=False),
)
transcripts = st.lists(st.one_of(user, synthetic, assistant), max_size=8)


async def record(sessions: Sessions, store: SQLiteStore, sid: str, spec: list[Any]) -> None:
    """Write ``spec`` into session ``sid`` through the facade and real step events."""
    for n, item in enumerate(spec):
        kind = item[0]
        if kind == "user":
            files = tuple(
                FileInput(data=base64.b64encode(b).decode(), mime="text/plain") for b in item[2]
            )
            await sessions.prompt(
                sid,
                PromptInput(text=item[1], files=files or None, metadata=item[3], resume=False),
            )
            await sessions.promote(sid, "steer")
        elif kind == "synthetic":
            await sessions.synthetic(
                sid, SyntheticInput(text=item[1], description=item[2], resume=False)
            )
            await sessions.promote(sid, "steer")
        else:
            await store.append(Command.of(*_step(sid, f"msg_step{n}", item)))


def _step(sid: str, aid: str, item: tuple[Any, ...]) -> list[ev.Event]:
    _, parts, finish, (i, o, r, cr, cw), cost = item
    model = ModelRef(id="m1", provider_id="scripted")
    events: list[ev.Event] = [
        ev.StepStarted(
            session_id=sid, assistant_message_id=aid, agent="build", model=model, started=1
        )
    ]
    for ordinal, p in enumerate(parts):
        if p[0] == "text":
            events += [
                ev.TextStarted(session_id=sid, assistant_message_id=aid, ordinal=ordinal),
                ev.TextEnded(session_id=sid, assistant_message_id=aid, ordinal=ordinal, text=p[1]),
            ]
        elif p[0] == "reasoning":
            events += [
                ev.ReasoningStarted(session_id=sid, assistant_message_id=aid, ordinal=ordinal),
                ev.ReasoningEnded(
                    session_id=sid, assistant_message_id=aid, ordinal=ordinal, text=p[1]
                ),
            ]
        else:
            call = f"call_{ordinal}"
            events.append(
                ev.ToolCalled(
                    session_id=sid, assistant_message_id=aid, id=call, name=p[1], input=p[2]
                )
            )
            output = ({"type": "text", "text": p[4]},)
            if p[3]:
                events.append(
                    ev.ToolSucceeded(
                        session_id=sid, assistant_message_id=aid, id=call, content=output
                    )
                )
            else:
                events.append(
                    ev.ToolFailed(
                        session_id=sid,
                        assistant_message_id=aid,
                        id=call,
                        error=ev.ErrorInfo(type="tool.error", message=p[4]),
                        content=output,
                    )
                )
    tokens = ev.StepTokens(input=i, output=o, reasoning=r, cache_read=cr, cache_write=cw)
    if finish is None:
        events.append(
            ev.StepFailed(
                session_id=sid,
                assistant_message_id=aid,
                error=ev.ErrorInfo(type="provider.transport", message="gone"),
                cost=cost,
                tokens=tokens,
            )
        )
    else:
        events.append(
            ev.StepEnded(
                session_id=sid, assistant_message_id=aid, finish=finish, cost=cost, tokens=tokens
            )
        )
    return events


def comparable(document: SessionExport) -> dict[str, Any]:
    """The document without what an import renews: ids, seqs, the session's times."""
    data: dict[str, Any] = codec.to_json(document)
    info = data["info"]
    for key in ("id", "time"):
        info.pop(key)
    for message in data["messages"]:
        for key in ("id", "sessionID", "seq"):
            message.pop(key)
    return data


def renamed(document: SessionExport, session_id: str) -> SessionExport:
    info = codec.to_json(document.info)
    info["id"] = session_id
    return SessionExport(
        info=codec.from_json(type(document.info), info), messages=document.messages
    )


async def round_trip(path: Path, spec: list[Any]) -> None:
    async with SQLiteStore(path) as store:
        sessions = Sessions(store, default_directory=str(path.parent))
        transfer = SessionTransfer(
            store, sessions, directories=DirectoryRules(), blocking=asyncio.to_thread
        )
        source = await sessions.create(CreateSessionInput(title="source", metadata={"k": 1}))
        await record(sessions, store, source.id, spec)
        first = await transfer.export(source.id)
        assert len(first.messages) == len(spec)

        imported = await transfer.import_(renamed(first, "ses_copy1"))
        assert imported.id == "ses_copy1"
        second = await transfer.export(imported.id)
        assert comparable(second) == comparable(first)
        assert second.info.cost == pytest.approx(first.info.cost)

        # Again, from the import: nothing drifts.
        await transfer.import_(renamed(second, "ses_copy2"))
        third = await transfer.export("ses_copy2")
        assert comparable(third) == comparable(second)

        # Sanitized: no file bytes, no tool output, the rest as it was; imports too.
        clean = await transfer.export(source.id, sanitize=True)
        for message in clean.messages:
            if isinstance(message, UserMessage):
                assert all(f.data == "" for f in message.files or ())
            if isinstance(message, AssistantMessage):
                tools = [p for p in message.parts if isinstance(p, ToolPart)]
                assert all(t.content is None and t.metadata is None for t in tools)
        assert [type(m) for m in clean.messages] == [type(m) for m in first.messages]
        await transfer.import_(renamed(clean, "ses_clean"))
        assert len((await transfer.export("ses_clean")).messages) == len(spec)

        # The id is taken now (the original's too): 409, nothing written.
        before = await store.last_seq("ses_copy1")
        with pytest.raises(ConflictError):
            await transfer.import_(renamed(first, "ses_copy1"))
        with pytest.raises(ConflictError):
            await transfer.import_(first)
        assert await store.last_seq("ses_copy1") == before
        with pytest.raises(SessionNotFoundError):
            await transfer.export("ses_missing")
    stored, rebuilt = rebuild_projections(str(path))
    assert stored == rebuilt


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts)
def test_export_import_export_is_identical_apart_from_ids_and_times(spec: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(round_trip(Path(tmp) / "transfer.sqlite", spec))


async def test_a_deleted_sessions_id_stays_spent(
    store: SQLiteStore, sessions: Sessions, tmp_path: Path
) -> None:
    transfer = SessionTransfer(
        store, sessions, directories=DirectoryRules(), blocking=asyncio.to_thread
    )
    s = await sessions.create()
    document = await transfer.export(s.id)
    await sessions.remove(s.id)
    with pytest.raises(ConflictError):
        await transfer.import_(document)


async def test_a_document_that_cannot_be_stored_is_a_400_and_writes_nothing(
    store: SQLiteStore, sessions: Sessions
) -> None:
    transfer = SessionTransfer(
        store, sessions, directories=DirectoryRules(), blocking=asyncio.to_thread
    )
    s = await sessions.create()
    await record(
        sessions, store, s.id, [("assistant", [("text", "a")], "stop", (1, 1, 0, 0, 0), 0.1)]
    )
    document = codec.to_json(await transfer.export(s.id))
    document["info"]["id"] = "ses_bad"
    twice = {**document, "messages": [dict(document["messages"][0])]}
    twice["messages"][0]["parts"] = twice["messages"][0]["parts"] * 2
    wide = {**document, "info": {**document["info"], "tokens": {"input": 2**64}}}
    for bad in (twice, wide):
        with pytest.raises(InvalidRequestError):
            await transfer.import_(codec.from_json(SessionExport, bad))
    assert await store.queries.session("ses_bad") is None
    assert await store.last_seq("ses_bad") == 0
