"""Each output kind decodes, and each op sends its method, path, query and body."""

from __future__ import annotations

from collections.abc import Awaitable

from client.fake_server import INBOX_ITEM, SESSION, FakeServer, session

from protocol.client import Client
from protocol.operations import (
    ActiveSession,
    AgentInput,
    DeliveryInput,
    InterruptQuery,
    InterruptResult,
    MessagesQuery,
    SessionListQuery,
)
from protocol.requests import CreateSessionInput, PromptInput, UpdateSessionInput
from protocol.shapes import (
    AssistantMessage,
    InboxItem,
    Location,
    PageCursor,
    Session,
    TextPart,
    ToolPart,
    UserMessage,
)

USER_MESSAGE = {
    "type": "user",
    "id": "msg_2",
    "sessionID": "ses_1",
    "seq": 3,
    "time": {"created": 10, "updated": 10},
    "text": "hello",
}
ASSISTANT_MESSAGE = {
    "type": "assistant",
    "id": "msg_3",
    "sessionID": "ses_1",
    "seq": 5,
    "time": {"created": 11, "updated": 12},
    "parts": [
        {"type": "text", "ordinal": 0, "text": "hi"},
        {"type": "tool", "id": "call_1", "name": "read", "status": "completed"},
    ],
}


async def test_data_output_decodes_to_the_shape(client: Client, fake: FakeServer) -> None:
    fake.json("GET", "/api/session/ses_1", {"data": SESSION})

    got = await client.sessions.get("ses_1")

    assert isinstance(got, Session)
    assert got.id == "ses_1"
    assert got.location == Location(directory="/work")
    assert got.tokens.cache.read == 1
    assert fake.last.method == "GET"
    assert fake.last.headers["Accept"] == "application/json"


async def test_path_parameters_are_percent_encoded(client: Client, fake: FakeServer) -> None:
    fake.json("GET", "/api/session/a%2Fb%20c", {"data": session(id="a/b c")})

    got = await client.sessions.get("a/b c")

    assert got.id == "a/b c"
    assert fake.last.path == "/api/session/a%2Fb%20c"


async def test_a_base_url_path_prefix_is_kept(fake: FakeServer) -> None:
    fake.json("GET", "/prefix/api/session/ses_1", {"data": SESSION})

    async with Client(fake.url + "prefix/") as client:
        got = await client.sessions.get("ses_1")

    assert got.id == "ses_1"


async def test_create_without_input_sends_an_empty_object(client: Client, fake: FakeServer) -> None:
    fake.json("POST", "/api/session", {"data": SESSION})

    await client.sessions.create()

    assert fake.last.method == "POST"
    assert fake.last.headers["Content-Type"] == "application/json"
    assert fake.last.json() == {}


async def test_create_sends_the_input_in_wire_names(client: Client, fake: FakeServer) -> None:
    fake.json("POST", "/api/session", {"data": session(id="ses_2", parentID="ses_1")})

    got = await client.sessions.create(
        CreateSessionInput(id="ses_2", parent_id="ses_1", title="child")
    )

    assert got.parent_id == "ses_1"
    assert fake.last.json() == {"id": "ses_2", "parentID": "ses_1", "title": "child"}


async def test_prompt_returns_the_admission_receipt(client: Client, fake: FakeServer) -> None:
    fake.json("POST", "/api/session/ses_1/prompt", {"data": INBOX_ITEM})

    receipt = await client.sessions.prompt("ses_1", PromptInput(text="hello", delivery="queue"))

    assert receipt == InboxItem(
        id="msg_1",
        session_id="ses_1",
        type="user",
        delivery="steer",
        time_created=1764460000002,
        payload={"text": "hello"},
    )
    assert fake.last.json() == {"text": "hello", "delivery": "queue", "resume": True}


async def test_page_decodes_and_continues_with_only_the_cursor(
    client: Client, fake: FakeServer
) -> None:
    fake.json_sequence(
        "GET",
        "/api/session",
        [
            {"data": [SESSION, session(id="ses_2")], "cursor": {"next": "CUR1"}},
            {"data": [session(id="ses_3")], "cursor": {"previous": "CUR0"}},
        ],
    )

    first = await client.sessions.list(SessionListQuery(limit=2, order="asc", parent_id="null"))
    second = await client.sessions.list_next(first.cursor.next or "")

    assert [s.id for s in first.data] == ["ses_1", "ses_2"]
    assert first.cursor == PageCursor(next="CUR1")
    assert [s.id for s in second.data] == ["ses_3"]
    assert second.cursor == PageCursor(previous="CUR0")
    assert fake.requests[0].query == (("limit", "2"), ("order", "asc"), ("parentID", "null"))
    assert fake.requests[1].query == (("cursor", "CUR1"),)


async def test_a_page_without_a_cursor_member_has_an_empty_cursor(
    client: Client, fake: FakeServer
) -> None:
    fake.json("GET", "/api/session", {"data": []})

    page = await client.sessions.list()

    assert page.data == ()
    assert page.cursor == PageCursor()
    assert fake.last.query == ()


async def test_message_pages_decode_the_union_by_type(client: Client, fake: FakeServer) -> None:
    fake.json(
        "GET",
        "/api/session/ses_1/message",
        {"data": [USER_MESSAGE, ASSISTANT_MESSAGE], "cursor": {"next": "M1"}},
    )

    page = await client.sessions.messages("ses_1", MessagesQuery(limit=2, order="desc"))
    await client.sessions.messages_next("ses_1", "M1")

    user, assistant = page.data
    assert isinstance(user, UserMessage)
    assert isinstance(assistant, AssistantMessage)
    assert isinstance(assistant.parts[0], TextPart)
    assert isinstance(assistant.parts[1], ToolPart)
    assert fake.requests[0].query == (("limit", "2"), ("order", "desc"))
    assert fake.requests[1].path == "/api/session/ses_1/message"
    assert fake.requests[1].query == (("cursor", "M1"),)


async def test_one_message(client: Client, fake: FakeServer) -> None:
    fake.json("GET", "/api/session/ses_1/message/msg_3", {"data": ASSISTANT_MESSAGE})

    got = await client.sessions.message("ses_1", "msg_3")

    assert isinstance(got, AssistantMessage)
    assert got.seq == 5


async def test_items_output_is_a_tuple(client: Client, fake: FakeServer) -> None:
    fake.json(
        "GET", "/api/session/ses_1/inbox", {"data": [INBOX_ITEM, {**INBOX_ITEM, "id": "msg_9"}]}
    )
    fake.json("GET", "/api/session/ses_1/context", {"data": [USER_MESSAGE]})

    inbox = await client.sessions.inbox("ses_1")
    context = await client.sessions.context("ses_1")

    assert [i.id for i in inbox] == ["msg_1", "msg_9"]
    assert isinstance(inbox, tuple)
    assert context == (
        UserMessage(id="msg_2", session_id="ses_1", seq=3, time=context[0].time, text="hello"),
    )


async def test_raw_output_and_boolean_query(client: Client, fake: FakeServer) -> None:
    fake.json("POST", "/api/session/ses_1/interrupt", {"interrupted": True})

    got = await client.sessions.interrupt("ses_1", InterruptQuery(resume=True))
    await client.sessions.interrupt("ses_1")

    assert got == InterruptResult(interrupted=True)
    assert fake.requests[0].query == (("resume", "true"),)
    assert fake.requests[1].query == ()
    assert fake.requests[1].body == b""


async def test_active_decodes_each_value(client: Client, fake: FakeServer) -> None:
    fake.json("GET", "/api/session/active", {"data": {"ses_1": {"type": "running"}}})

    got = await client.sessions.active()

    assert got == {"ses_1": ActiveSession()}


async def test_no_content_operations_return_none(client: Client, fake: FakeServer) -> None:
    fake.no_content("PATCH", "/api/session/ses_1")
    fake.no_content("DELETE", "/api/session/ses_1")
    fake.no_content("POST", "/api/session/ses_1/agent")
    fake.no_content("PATCH", "/api/session/ses_1/inbox/msg_1")
    fake.no_content("DELETE", "/api/session/ses_1/inbox/msg_1")
    fake.no_content("POST", "/api/experimental/session/ses_1/wait")

    results = [
        await returned(client.sessions.update("ses_1", UpdateSessionInput(title="renamed"))),
        await returned(client.sessions.remove("ses_1")),
        await returned(client.sessions.switch_agent("ses_1", AgentInput(agent="plan"))),
        await returned(
            client.sessions.change_delivery("ses_1", "msg_1", DeliveryInput(delivery="queue"))
        ),
        await returned(client.sessions.cancel("ses_1", "msg_1")),
        await returned(client.sessions.wait("ses_1")),
    ]

    assert results == [None] * 6
    sent = [(r.method, r.path, r.body) for r in fake.requests]
    assert sent == [
        ("PATCH", "/api/session/ses_1", b'{"title":"renamed"}'),
        ("DELETE", "/api/session/ses_1", b""),
        ("POST", "/api/session/ses_1/agent", b'{"agent":"plan"}'),
        ("PATCH", "/api/session/ses_1/inbox/msg_1", b'{"delivery":"queue"}'),
        ("DELETE", "/api/session/ses_1/inbox/msg_1", b""),
        ("POST", "/api/experimental/session/ses_1/wait", b""),
    ]


async def returned(call: Awaitable[object]) -> object:
    return await call
