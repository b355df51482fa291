"""The SSE decoder follows the spec's line and field rules, however the bytes are chunked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.client import SSEEvent
from protocol.sse import SSEDecodeError, SSEDecoder, SSEFrame, parse_frame, parse_raw


def frames(*chunks: bytes) -> list[SSEFrame]:
    decoder = SSEDecoder()
    out: list[SSEFrame] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    out.extend(decoder.end())
    return out


def test_fields_and_one_stripped_space() -> None:
    got = frames(b'id: 7\nevent: session.created\ndata:  {"a": 1}\n\n')

    assert got == [SSEFrame(id=7, event="session.created", data=' {"a": 1}')]


def test_value_without_a_space_after_the_colon() -> None:
    assert frames(b"event:x\ndata:1\n\n") == [SSEFrame(event="x", data="1")]


def test_data_lines_join_with_newlines() -> None:
    assert frames(b"data: [1,\ndata: 2]\n\n") == [SSEFrame(data="[1,\n2]")]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_every_line_ending(eol: bytes) -> None:
    text = eol.join([b"id: 1", b"data: 1", b"", b": ping", b"data: 2", b"", b""])

    assert frames(text) == [SSEFrame(id=1, data="1"), SSEFrame(data="2")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    got = frames(b": ping\n\n:\nretry: 10\nfoo: bar\ndata\ndata: x\n\n")

    # "data" without a colon is a data line with an empty value.
    assert got == [SSEFrame(data="\nx")]


def test_a_frame_without_data_is_not_dispatched() -> None:
    assert frames(b"id: 3\nevent: nothing\n\ndata: 1\n\n") == [SSEFrame(data="1")]


def test_id_is_per_frame_and_last_event_id_is_sticky() -> None:
    decoder = SSEDecoder()

    got = decoder.feed(b"id: 4\ndata: 1\n\ndata: 2\n\nid: evt_x\ndata: 3\n\n")

    assert [f.id for f in got] == [4, None, None]
    assert decoder.last_event_id == "evt_x"


def test_an_id_with_nul_is_ignored() -> None:
    decoder = SSEDecoder()
    got = decoder.feed(b"id: 1\0\ndata: 1\n\n")
    assert got == [SSEFrame(data="1")]
    assert decoder.last_event_id is None


def test_a_leading_bom_is_dropped_once() -> None:
    got = frames(b"\xef\xbb\xbfdata: 1\n\n")

    assert got == [SSEFrame(data="1")]


def test_an_unfinished_frame_is_dropped_at_the_end() -> None:
    assert frames(b"data: 1\n\ndata: 2\n") == [SSEFrame(data="1")]


def test_an_open_frame_whose_lines_ended_is_dispatched_when_asked() -> None:
    # A provider may omit the blank line after its last event; a cut line is still dropped.
    decoder = SSEDecoder()
    assert decoder.feed(b"event: e\ndata: 1\r") == []
    assert decoder.end(dispatch_open=True) == [SSEFrame(event="e", data="1")]
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\ndata: 2") == []
    assert decoder.end(dispatch_open=True) == []


def test_a_final_cr_ends_its_line() -> None:
    assert frames(b"data: 1\r\r") == [SSEFrame(data="1")]


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    assert frames(b'data: "\xff"\n\n') == [SSEFrame(data='"\ufffd"')]


def test_parse_frame_reads_json_data() -> None:
    assert parse_frame(SSEFrame(id=1, event="e", data='{"x": [1]}')) == SSEEvent(
        id=1, event="e", data={"x": [1]}
    )
    with pytest.raises(SSEDecodeError, match="not JSON"):
        parse_frame(SSEFrame(data="{nope"))


STREAM = (
    b"\xef\xbb\xbf: hello\r\n\r\n"
    b'id: 1\r\nevent: a\r\ndata: {"k":\r\ndata: "\xc3\xa9"}\r\n\r\n'
    b"id: 2\rdata: 2\r\r"
    b"event: b\ndata: 3\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_chunking_never_changes_the_frames(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]

    assert frames(*chunks) == [
        SSEFrame(id=1, event="a", data='{"k":\n"\u00e9"}'),
        SSEFrame(id=2, data="2"),
        SSEFrame(event="b", data="3"),
    ]


def test_raw_frames_keep_data_bytes_and_parse_like_decoded_ones() -> None:
    decoder = SSEDecoder()

    raw = decoder.feed_raw(b'id: 5\nevent: e\ndata: {"k":\ndata: "\xc3\xa9"}\n\ndata: "\xff"\n\n')

    assert raw == [(5, "e", b'{"k":\n"\xc3\xa9"}'), (None, None, b'"\xff"')]
    # Valid UTF-8 goes to orjson as it came; invalid is decoded with replacement first.
    assert [parse_raw(r) for r in raw] == [
        SSEEvent(id=5, event="e", data={"k": "\u00e9"}),
        SSEEvent(data="\ufffd"),
    ]
    with pytest.raises(SSEDecodeError, match="not JSON"):
        parse_raw((None, None, b"{nope"))


def test_event_names_are_remembered_per_line_not_mixed_up() -> None:
    decoder = SSEDecoder()
    got = decoder.feed(
        b"event: a\ndata: 1\n\nevent:a\ndata: 2\n\nevent: b\ndata: 3\n\nevent: a\ndata: 4\n\n"
    )

    assert [f.event for f in got] == ["a", "a", "b", "a"]
