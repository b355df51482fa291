from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import values_of

from protocol import (
    REGISTRY,
    InboxItem,
    InvalidRequestError,
    Session,
    codec,
    decode_event,
    encode_data,
    envelope,
    stored_type,
)
from protocol import events as ev
from protocol.requests import PromptInput
from protocol.shapes import AssistantMessage, SessionMessage, UserMessage


@pytest.mark.parametrize("stored", sorted(REGISTRY))
@given(data=st.data())
def test_every_event_type_round_trips(stored: str, data: st.DataObject) -> None:
    cls = REGISTRY[stored]
    event = data.draw(values_of(cls))
    encoded = encode_data(event)
    assert decode_event(stored_type(event), encoded) == event
    # Encoding is canonical: the same value always gives the same bytes.
    assert encode_data(decode_event(stored, encoded)) == encoded  # type: ignore[arg-type]


@given(values_of(Session))
def test_session_round_trips(session: Session) -> None:
    assert codec.from_json(Session, orjson.loads(codec.dumps(session))) == session


@given(st.one_of(values_of(UserMessage), values_of(AssistantMessage)))
def test_message_union_decodes_by_type(message: Any) -> None:
    decoded = codec.from_json(SessionMessage, orjson.loads(codec.dumps(message)))  # type: ignore[arg-type]
    assert decoded == message


def test_stored_type_carries_version_and_wire_type_does_not() -> None:
    deleted = ev.SessionDeleted(session_id="ses_1")
    assert stored_type(deleted) == "session.deleted.2"
    out = envelope(id="evt_1", created=5, event=deleted, seq=3)
    assert out == {
        "id": "evt_1",
        "created": 5,
        "type": "session.deleted",
        "durable": {"aggregateID": "ses_1", "seq": 3, "version": 2},
        "data": {"sessionID": "ses_1"},
    }


def test_unknown_stored_type_is_skipped_not_a_crash() -> None:
    assert decode_event("session.from-the-future.9", b'{"sessionID": "ses_1"}') is None


def test_wire_names_keep_id_upper_case() -> None:
    assert codec.wire_name("assistant_message_id") == "assistantMessageID"
    assert codec.wire_name("time_created") == "timeCreated"
    item = InboxItem(
        id="msg_1", session_id="ses_1", type="user", delivery="queue", time_created=7, payload={}
    )
    assert set(codec.to_json(item)) == {
        "id",
        "sessionID",
        "type",
        "delivery",
        "timeCreated",
        "payload",
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "text"),
        ({"text": 5}, "text"),
        ({"text": "x", "delivery": "later"}, "delivery"),
        ({"text": "x", "resume": "yes"}, "resume"),
        ({"text": "x", "files": [{"mime": "text/plain"}]}, "files"),
        ({"text": "x", "files": {"uri": "file:///x"}}, "files"),
        ({"text": "x", "id": "ses_wrongprefix"}, "id"),
        ({"text": "x", "metadata": []}, "metadata"),
        ([], None),
    ],
)
def test_decoding_bad_input_names_the_field(body: Any, field: str | None) -> None:
    with pytest.raises(InvalidRequestError) as info:
        codec.from_json(PromptInput, body)
    assert info.value.status == 400
    assert info.value.fields.get("field") == field


def test_malformed_json_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError) as info:
        codec.loads(b"{nope")
    assert info.value.fields["kind"] == "json"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"time": {"created": "x", "updated": 2}}, "time.created"),
        ({"time": {"created": 1, "updated": True}}, "time.updated"),  # a bool is no integer
        ({"model": {"id": 3, "providerID": "p"}}, "model.id"),
        ({"parts": [{"type": "text", "ordinal": 0, "text": ["no"]}]}, "parts[0].text"),
        ({"parts": [{"type": ["text"], "ordinal": 0, "text": "t"}]}, "parts[0].type"),
        ({"error": "boom"}, "error"),
    ],
)
def test_a_bad_member_deep_inside_is_named_by_its_path(data: Any, field: str) -> None:
    good = {
        "type": "assistant",
        "id": "msg_1",
        "sessionID": "ses_1",
        "seq": 1,
        "time": {"created": 1, "updated": 2},
    }
    assert codec.from_json(AssistantMessage, good).seq == 1
    with pytest.raises(InvalidRequestError) as info:
        codec.from_json(AssistantMessage, {**good, **data})
    assert info.value.fields.get("field") == field


def test_to_json_walks_plain_data_and_keeps_scalars_as_they_are() -> None:
    import enum

    class Color(enum.StrEnum):
        RED = "red"

    item = PromptInput(text="hi", delivery="queue")
    data = {"a": [item, (1, 2.5, True, None)], "b": {"c": item}, "s": "x", "e": Color.RED}
    encoded = codec.to_json(data)
    wire = codec.to_json(item)
    assert wire == {"text": "hi", "delivery": "queue", "resume": True}
    assert encoded == {"a": [wire, [1, 2.5, True, None]], "b": {"c": wire}, "s": "x", "e": "red"}
    assert encoded["e"] is Color.RED  # a str subclass passes through unchanged, as before
    assert codec.to_json(item) is not codec.to_json(item)  # a fresh dict each time
