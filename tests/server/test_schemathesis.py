"""Schemathesis: the OpenAPI document at ``/doc`` against the live server.

``sessionrt serve`` runs as a subprocess (schemathesis' calls are blocking, so
the server must not share the test's event loop). The schema is loaded when
the module is collected (schemathesis' lazy fixture loader does not work with
this pytest), from the same :func:`protocol.openapi.document` the server
serves; the first test proves the live ``/doc`` is that document. Each
operation gets a few dozen generated requests, valid and not; every answer
must be what the document says: no 500, a declared status, a declared content
type and a body that matches its schema, a 4xx for a request the schema
refuses and a 405 for a method it does not declare.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from proc_groups import kill_group
from schemathesis.specs.openapi.checks import positive_data_acceptance

from protocol.openapi import document

pytestmark = pytest.mark.fuzz

EXE = str(Path(sys.executable).with_name("sessionrt"))
#: Streams that never end on their own; their refusals are covered in test_browser.
ENDLESS = ("event.subscribe",)


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("schemathesis")
    proc = subprocess.Popen(
        [EXE, "serve", "--port", "0", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        match = re.search(r"http://\S+", line)
        assert match, line
        yield match.group(0)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        finally:  # a timeout, or Ctrl-C while it stops
            if proc.returncode is None:
                kill_group(proc)
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


schema = schemathesis.openapi.from_dict(document()).exclude(operation_id=list(ENDLESS))


def test_the_live_doc_is_the_tested_document(live_url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{live_url}/doc", timeout=30) as answer:
        assert orjson.loads(answer.read()) == document()


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_live_server_keeps_its_openapi_document(case: schemathesis.Case, live_url: str) -> None:
    if case.operation.definition.raw.get("operationId") == "session.log":
        case.query = {**(case.query or {}), "follow": "false"}
    # Every check but one: no 5xx, a declared status, content type and body,
    # schema-violating requests refused (negative data), undeclared methods a
    # 405. Not checked: that every schema-valid request is accepted. Semantic
    # rules a schema cannot say (an agent or provider that exists here, a file
    # with exactly one of uri/data, a cursor continuation taking only the
    # cursor, a session id that exists) make such requests 400s or 404s by
    # design; the schema does say what it can (ids' patterns, non-empty names,
    # absolute directories), tested in test_openapi_agreement.
    excluded = [positive_data_acceptance]
    case.call_and_validate(base_url=live_url, timeout=30, excluded_checks=excluded)
