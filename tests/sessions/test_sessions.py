"""Session lifecycle through the in-process facade, on a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.sessions import Sessions
from protocol import (
    ConflictError,
    InvalidCursorError,
    InvalidRequestError,
    Location,
    ModelRef,
    SessionNotFoundError,
    SessionQuery,
    events,
)
from protocol.requests import CreateSessionInput, UpdateSessionInput
from storage import SQLiteStore


async def test_create_fills_defaults_and_records_one_event(
    sessions: Sessions, store: SQLiteStore, tmp_path: Path
) -> None:
    session = await sessions.create()
    assert session.id.startswith("ses_")
    assert session.title.startswith("New session - ")
    assert session.location == Location(directory=str(tmp_path))
    assert session.time.created == session.time.updated
    [record] = await store.read(session.id)
    assert isinstance(record.event, events.SessionCreated)
    assert record.seq == 1


async def test_reusing_an_id_adopts_the_existing_session(
    sessions: Sessions, store: SQLiteStore
) -> None:
    first = await sessions.create(CreateSessionInput(id="ses_mine", title="first"))
    again = await sessions.create(CreateSessionInput(id="ses_mine", title="ignored"))
    assert again == first
    assert await store.last_seq("ses_mine") == 1


async def test_concurrent_creates_of_one_id_adopt_one_session(
    sessions: Sessions, store: SQLiteStore
) -> None:
    import asyncio

    made = await asyncio.gather(
        *(sessions.create(CreateSessionInput(id="ses_race", title=str(i))) for i in range(20))
    )
    assert len({m.title for m in made}) == 1
    assert await store.last_seq("ses_race") == 1


async def test_unknown_parent_is_not_found(sessions: Sessions) -> None:
    with pytest.raises(SessionNotFoundError) as info:
        await sessions.create(CreateSessionInput(parent_id="ses_nobody"))
    assert info.value.session_id == "ses_nobody"


async def test_relative_location_is_refused(sessions: Sessions) -> None:
    with pytest.raises(InvalidRequestError):
        await sessions.create(CreateSessionInput(location=Location(directory="relative/dir")))


async def test_get_unknown_and_malformed(sessions: Sessions) -> None:
    with pytest.raises(SessionNotFoundError):
        await sessions.get("ses_missing")
    with pytest.raises(InvalidRequestError):
        await sessions.get("msg_wrong_prefix")


async def test_update_title_and_metadata(sessions: Sessions, store: SQLiteStore) -> None:
    s = await sessions.create()
    await sessions.update(s.id, UpdateSessionInput(title="renamed", metadata={"k": [1, 2]}))
    got = await sessions.get(s.id)
    assert got.title == "renamed"
    assert got.metadata == {"k": [1, 2]}
    assert got.time.updated >= s.time.updated
    types = [r.type for r in await store.read(s.id)]
    assert types == ["session.created.1", "session.renamed.1", "session.metadata.updated.1"]
    with pytest.raises(SessionNotFoundError):
        await sessions.update("ses_missing", UpdateSessionInput(title="x"))


async def test_remove_takes_descendants_and_spends_the_id(
    sessions: Sessions, store: SQLiteStore
) -> None:
    root = await sessions.create(CreateSessionInput(id="ses_root"))
    child = await sessions.create(CreateSessionInput(parent_id=root.id))
    grandchild = await sessions.create(CreateSessionInput(parent_id=child.id))
    other = await sessions.create()
    await sessions.remove(root.id)
    for gone in (root.id, child.id, grandchild.id):
        with pytest.raises(SessionNotFoundError):
            await sessions.get(gone)
        assert (await store.read(gone))[-1].type == "session.deleted.2"
    assert await sessions.get(other.id) == other
    with pytest.raises(SessionNotFoundError):
        await sessions.remove(root.id)
    with pytest.raises(ConflictError):
        await sessions.create(CreateSessionInput(id="ses_root"))


async def test_switch_agent_and_model_record_previous(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create(CreateSessionInput(agent="build"))
    await sessions.switch_agent(s.id, "plan")
    await sessions.switch_agent(s.id, "plan")  # no change, no event
    model = ModelRef(id="m1", provider_id="scripted")
    await sessions.switch_model(s.id, model)
    got = await sessions.get(s.id)
    assert (got.agent, got.model) == ("plan", model)
    recorded = [r.event for r in await store.read(s.id)][1:]
    assert recorded == [
        events.AgentSelected(session_id=s.id, agent="plan", previous="build"),
        events.ModelSelected(session_id=s.id, model=model, previous=None),
    ]


async def test_list_filters(sessions: Sessions) -> None:
    root = await sessions.create(CreateSessionInput(title="alpha 100%"))
    child = await sessions.create(CreateSessionInput(title="beta", parent_id=root.id))
    await sessions.create(CreateSessionInput(title="gamma_1"))
    assert [s.id for s in (await sessions.list(SessionQuery(parent_id=root.id))).data] == [child.id]
    roots = (await sessions.list(SessionQuery(roots=True))).data
    assert child.id not in {s.id for s in roots}
    assert len(roots) == 2
    # LIKE wildcards in the search are literal.
    assert [s.title for s in (await sessions.list(SessionQuery(search="100%"))).data] == [
        "alpha 100%"
    ]
    # As a wildcard "a_" would match "alpha" too; literally only "gamma_1" has it.
    assert [s.title for s in (await sessions.list(SessionQuery(search="a_"))).data] == ["gamma_1"]


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_list_pages_round_trip_in_both_directions(sessions: Sessions, order: str) -> None:
    made = [await sessions.create(CreateSessionInput(title=f"s{i}")) for i in range(7)]
    expected = sorted(made, key=lambda s: (s.time.updated, s.id), reverse=order == "desc")
    first = await sessions.list(SessionQuery(order=order, limit=3))  # type: ignore[arg-type]
    assert first.cursor.previous is None
    pages = [first]
    while pages[-1].cursor.next:
        pages.append(await sessions.list(cursor=pages[-1].cursor.next))
    assert [len(p.data) for p in pages] == [3, 3, 1]
    assert [s.id for p in pages for s in p.data] == [s.id for s in expected]
    assert pages[-1].cursor.next is None
    # Walking back from the last page gives the same pages in reverse.
    back = [pages[-1]]
    while back[-1].cursor.previous:
        back.append(await sessions.list(cursor=back[-1].cursor.previous))
    assert [p.data for p in back] == [p.data for p in reversed(pages)]
    assert back[-1].cursor.previous is None


async def test_list_rejects_bad_input(sessions: Sessions) -> None:
    with pytest.raises(InvalidCursorError):
        await sessions.list(cursor="garbage")
    with pytest.raises(InvalidRequestError):
        await sessions.list(SessionQuery(limit=0))
    with pytest.raises(InvalidRequestError):
        await sessions.list(SessionQuery(limit=201))
    with pytest.raises(InvalidRequestError):
        await sessions.list(SessionQuery(parent_id="msg_x"))
    await sessions.create()
    await sessions.create()
    page = await sessions.list(SessionQuery(limit=1))
    assert page.cursor.next is not None
    with pytest.raises(InvalidRequestError):
        await sessions.list(SessionQuery(limit=1), cursor=page.cursor.next)
