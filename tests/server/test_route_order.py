"""Which route answers a path: the registration order is a speed choice, never a meaning.

The admission route is registered first (aiohttp tries a prefix's routes in
registration order, one regex each); these tests hold that every operation's
path still reaches its own route, that a wrong method is still a 405 naming
every method of that path, and that the admission is tried first.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from actors.runtime import RuntimeConfig
from protocol.operations import OPERATIONS, Operation
from server.app import make_app


@pytest.fixture
def app(tmp_path: Path) -> web.Application:
    # Routes are built by make_app; the runtime opens only when the app starts.
    application = make_app(config=RuntimeConfig(data_dir=tmp_path / "data"))
    application.router.freeze()
    return application


def _concrete(op: Operation) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: f"{m.group(1).lower()}_x1", op.path)


async def _route_name(app: web.Application, method: str, path: str) -> str | None:
    match = await app.router.resolve(make_mocked_request(method, path, app=app))
    http_exception = match.http_exception
    if http_exception is not None:
        raise http_exception
    return match.route.name


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.id)
async def test_every_operation_path_reaches_its_own_route(
    app: web.Application, op: Operation
) -> None:
    path = _concrete(op)
    assert await _route_name(app, op.method, path) == op.id
    if op.method == "GET":
        assert await _route_name(app, "HEAD", path) == op.id


async def test_a_wrong_method_on_a_path_shared_by_routes_is_a_405_naming_all_of_them(
    app: web.Application,
) -> None:
    with pytest.raises(web.HTTPMethodNotAllowed) as raised:
        await _route_name(app, "PUT", "/api/session/ses_x1/prompt")
    assert raised.value.allowed_methods == {"POST"}
    with pytest.raises(web.HTTPMethodNotAllowed) as raised:
        await _route_name(app, "PUT", "/api/session/ses_x1")
    assert raised.value.allowed_methods == {"GET", "HEAD", "PATCH", "DELETE"}


def test_the_admission_route_is_tried_first(app: web.Application) -> None:
    first = next(iter(app.router.resources()))
    assert first.name == "session.prompt"
