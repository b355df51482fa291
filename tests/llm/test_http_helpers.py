"""The pieces both adapters share: retry-after parsing, x-should-retry, scrubbing, SSE limits."""

from __future__ import annotations

import email.utils

import pytest

from actors.llm import ProviderConfig
from actors.llm._http import HttpTransport, retry_after_ms, should_retry
from protocol.sse import MAX_LINE_BYTES, SSEDecoder, SSELineTooLongError


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7000),
        ({"retry-after": "0.25"}, 250),
        ({"retry-after-ms": "1500"}, 1500),
        ({"retry-after-ms": "12.2", "retry-after": "60"}, 13),
        ({"retry-after-ms": "junk", "retry-after": "2"}, 2000),
        ({"retry-after": "-3"}, None),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after(headers: dict[str, str], expected: int | None) -> None:
    assert retry_after_ms(headers) == expected


def test_retry_after_as_an_http_date() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_ms({"retry-after": date}, now=now) == 30_000
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert retry_after_ms({"retry-after": past}, now=now) == 0


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("FALSE", False), ("maybe", None), (None, None)]
)
def test_should_retry(value: str | None, expected: bool | None) -> None:
    assert should_retry({} if value is None else {"x-should-retry": value}) is expected


def test_scrub_removes_the_key_masked_fragments_and_the_host() -> None:
    transport = HttpTransport(
        ProviderConfig(id="p", kind="openai", base_url="https://api.example.test:8443/v1")
    )
    key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    text = (
        f"key {key}; masked sk-pro************WXYZ; host api.example.test:8443;"
        " model gpt-4o-mini not found"
    )
    scrubbed = transport.scrub(text, key)
    assert key not in scrubbed
    assert "WXYZ" not in scrubbed
    assert "sk-pro" not in scrubbed
    assert "api.example.test" not in scrubbed
    assert "model gpt-4o-mini not found" in scrubbed


def test_an_endless_sse_line_is_refused() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: " + b"x" * (MAX_LINE_BYTES // 2))
    with pytest.raises(SSELineTooLongError):
        decoder.feed(b"x" * (MAX_LINE_BYTES // 2 + 10))
