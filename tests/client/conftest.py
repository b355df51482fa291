"""Fixtures: a real aiohttp server on loopback with canned replies, and a client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from client.fake_server import FakeServer

from protocol.client import Client

AiohttpServer = Callable[[web.Application], Awaitable[TestServer]]


@pytest.fixture
async def fake(aiohttp_server: AiohttpServer) -> FakeServer:
    fake = FakeServer()
    server = await aiohttp_server(fake.app)
    fake.url = str(server.make_url("/"))
    return fake


@pytest.fixture
async def client(fake: FakeServer) -> AsyncIterator[Client]:
    async with Client(fake.url) as client:
        yield client
