from __future__ import annotations

import base64

import pytest
from hypothesis import given
from strategies import values_of

from protocol import (
    InvalidCursorError,
    MessageCursor,
    SessionCursor,
    decode_cursor,
    encode_cursor,
)


@given(values_of(SessionCursor))
def test_session_cursor_round_trips(cursor: SessionCursor) -> None:
    text = encode_cursor(cursor)
    assert "=" not in text
    assert "+" not in text
    assert "/" not in text
    assert decode_cursor(SessionCursor, text) == cursor


@given(values_of(MessageCursor))
def test_message_cursor_round_trips(cursor: MessageCursor) -> None:
    assert decode_cursor(MessageCursor, encode_cursor(cursor)) == cursor


@pytest.mark.parametrize(
    "text",
    [
        "",
        "!!!",
        "not-base64-json",
        base64.urlsafe_b64encode(b"[1, 2]").decode(),
        base64.urlsafe_b64encode(b'{"order": "sideways"}').decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_garbage_is_an_invalid_cursor(text: str) -> None:
    with pytest.raises(InvalidCursorError):
        decode_cursor(SessionCursor, text)


def test_a_message_cursor_is_not_a_session_cursor() -> None:
    from protocol.cursor import MessageAnchor

    text = encode_cursor(
        MessageCursor(
            session_id="ses_1",
            order="asc",
            limit=5,
            anchor=MessageAnchor(id="msg_1", seq=1, direction="next"),
        )
    )
    with pytest.raises(InvalidCursorError):
        decode_cursor(SessionCursor, text)
