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

Each operation is a test of its own, ``test_openapi_<operationId>`` (dots made
underscores): the one check function below decorated with ``parametrize()`` of a
schema narrowed to that operation, each result under its own name, as
schemathesis documents for reusing a test function. With ``parametrize()`` of
the whole schema the operations' items all got the function's id under pytest
9 (it builds an item's id from ``originalname`` and a callspec, and
schemathesis' items have no callspec), and xdist ran one of them and dropped the
45 others. :func:`test_every_operation_is_a_test_of_its_own` keeps that fixed.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from proc_groups import kill_group
from schemathesis.config import SchemathesisConfig
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
#: Operations tested without schemathesis' coverage phase: session.importSession's
#: nested body made 1,100 of its ~2,400 requests, 7 s of CPU, a third of the file.
#: Its fuzzing (valid and invalid documents) still runs, and test_import_safety
#: refuses bad documents one by one.
NO_COVERAGE = ("session.importSession",)
_without_coverage = schemathesis.openapi.from_dict(
    document(), config=SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": False}}})
)


def test_the_live_doc_is_the_tested_document(live_url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{live_url}/doc", timeout=30) as answer:
        assert orjson.loads(answer.read()) == document()


#: Generated examples per operation, schemathesis' fuzzing phase. Its coverage
#: phase comes on top, unbounded by this: deterministic boundary values and
#: undeclared methods, most of the file's requests (see NO_COVERAGE). So bounded,
#: the whole file, pytest and the server included, takes 11-13 s of CPU on the
#: 2-core machine, quiet (25 examples and importSession's coverage: 17 s).
MAX_EXAMPLES = 15


def _keeps_its_openapi_document(case: schemathesis.Case, live_url: str) -> None:
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


_bounded = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)(_keeps_its_openapi_document)


def _test_name(operation_id: str) -> str:
    return "test_openapi_" + re.sub(r"\W", "_", operation_id)


OPERATION_IDS: Final = tuple(
    str(result.ok().definition.raw["operationId"]) for result in schema.get_all_operations()
)
for _operation_id in OPERATION_IDS:
    _of = _without_coverage if _operation_id in NO_COVERAGE else schema
    globals()[_test_name(_operation_id)] = _of.include(operation_id=_operation_id).parametrize()(
        _bounded
    )
del _operation_id, _of


def test_every_operation_is_a_test_of_its_own(request: pytest.FixtureRequest) -> None:
    """One collected test per operation, each with an id of its own: xdist hands
    out tests by id, and a shared id ran one operation in place of 46."""
    declared = [
        operation["operationId"]
        for methods in document()["paths"].values()
        for operation in methods.values()
        if isinstance(operation, dict) and operation.get("operationId") not in ENDLESS
    ]
    assert sorted(OPERATION_IDS) == sorted(declared)
    module = request.node.parent
    assert isinstance(module, pytest.Module)
    ids = [
        item.nodeid
        for node in module.collect()
        if node.name.startswith("test_openapi_") and isinstance(node, pytest.Collector)
        for item in node.collect()
    ]
    assert len(ids) == len(set(ids)) == len(OPERATION_IDS), ids
