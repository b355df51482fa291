"""/metrics, /health and structured logs, over a real server and a real store."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from http_helpers import Client, create_session, runtime_of
from serve_proc import serving

from server.logs import configure

SCRIPT = '#tool bash {"command": "echo hi"}\n#step\n#text done'


def samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def scrape(client: Client, **kw: Any) -> dict[str, float]:
    response = await client.get("/metrics", **kw)
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/plain")
    return samples(await response.text())


async def test_metrics_count_what_the_store_committed(client: Client) -> None:
    before = await scrape(client)
    assert before["sessionrt_admissions_total"] == 0
    sid = (await create_session(client))["id"]
    response = await client.post(f"/api/session/{sid}/prompt", json={"text": SCRIPT})
    assert response.status == 200
    await client.post(f"/api/experimental/session/{sid}/wait")
    after = await scrape(client)
    assert after["sessionrt_admissions_total"] == 1
    assert after["sessionrt_deliveries_total"] == 1
    assert after['sessionrt_executions_total{outcome="succeeded"}'] == 1
    assert after["sessionrt_steps_total"] == 2
    assert after['sessionrt_tool_calls_total{outcome="success"}'] == 1
    assert after["sessionrt_retries_total"] == 0
    assert after["sessionrt_active_sessions"] == 0
    batches = after["sessionrt_store_batch_commands_count"]
    assert batches >= 3
    assert after["sessionrt_store_commit_seconds_count"] == batches
    assert after["sessionrt_store_batch_commands_sum"] >= batches


async def test_metrics_gauge_open_streams_and_running_sessions(client: Client) -> None:
    sid = (await create_session(client))["id"]
    feed = await client.get("/api/event")
    log = await client.get(f"/api/experimental/session/{sid}/log?follow=true")
    await feed.content.readline()
    await log.content.readline()
    await client.post(f"/api/session/{sid}/prompt", json={"text": "#delay 3000\n#text slow"})
    # Interrupt only once the step runs: an interrupt that lands before the
    # execution started ends it without an execution.interrupted to count.
    for _ in range(1000):
        now = await scrape(client)
        if now["sessionrt_active_sessions"] == 1 and now["sessionrt_steps_total"] >= 1:
            break
        await asyncio.sleep(0.02)
    assert now["sessionrt_active_sessions"] == 1
    assert now["sessionrt_steps_total"] >= 1
    assert now['sessionrt_sse_subscribers{stream="event"}'] == 1
    assert now['sessionrt_sse_subscribers{stream="log"}'] == 1
    feed.close()
    log.close()
    interrupted = await client.post(f"/api/session/{sid}/interrupt")
    assert await interrupted.json() == {"interrupted": True}
    for _ in range(1000):
        now = await scrape(client)
        if (
            now['sessionrt_sse_subscribers{stream="log"}'] == 0
            and not now['sessionrt_sse_subscribers{stream="event"}']
            and now['sessionrt_executions_total{outcome="interrupted"}'] == 1
        ):
            break
        await asyncio.sleep(0.02)
    assert now['sessionrt_sse_subscribers{stream="event"}'] == 0
    assert now['sessionrt_sse_subscribers{stream="log"}'] == 0
    assert now['sessionrt_executions_total{outcome="interrupted"}'] == 1


async def test_metrics_and_health_are_behind_the_password(make_client: Any) -> None:
    client = await make_client(password="pw")
    for path in ("/metrics", "/health"):
        response = await client.get(path)
        assert response.status == 401
        assert (await response.json())["_tag"] == "UnauthorizedError"
    ok = await client.get("/health", headers={"Authorization": "Bearer pw"})
    assert ok.status == 200
    assert (await scrape(client, headers={"Authorization": "Bearer pw"}))[
        "sessionrt_admissions_total"
    ] == 0


async def test_metrics_refuse_a_foreign_origin(client: Client) -> None:
    response = await client.get("/metrics", headers={"Origin": "http://evil.example"})
    assert response.status == 403


async def test_health_is_200_when_writable_and_503_when_not(client: Client) -> None:
    response = await client.get("/health")
    assert response.status == 200
    assert await response.json() == {"healthy": True}
    db = runtime_of(client).config.db_path
    # Another process holding the write lock: the store cannot take writes now.
    holder = await asyncio.create_subprocess_exec(
        "python3",
        "-c",
        "import sqlite3,sys,time\n"
        f"c=sqlite3.connect({str(db)!r},isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE');print('locked',flush=True);time.sleep(30)",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert await holder.stdout.readline() == b"locked\n"
        response = await client.get("/health")
        assert response.status == 503
        body = await response.json()
        assert body["_tag"] == "StorageUnavailableError"
        assert response.headers["Retry-After"] == "5"
    finally:
        holder.kill()
        await holder.wait()
    assert (await client.get("/health")).status == 200


def test_json_logs_are_one_object_a_line_and_never_hold_a_secret() -> None:
    stream = io.StringIO()
    handler = configure("json", secrets=["hunter2"], stream=stream)
    try:
        log = logging.getLogger("sessionrt.server")
        log.info("server started", extra={"fields": {"phase": "start", "port": 1}})
        try:
            raise ValueError("bad header Bearer hunter2")
        except ValueError:
            log.exception("unhandled error")
    finally:
        for name in ("sessionrt", "server", "actors", "storage", "protocol", "aiohttp"):
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).propagate = True
            logging.getLogger(name).setLevel(logging.NOTSET)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["event"] == "server started"
    assert lines[0]["phase"] == "start"
    assert lines[0]["level"] == "info"
    assert lines[1]["level"] == "error"
    assert "ValueError" in lines[1]["exception"]
    assert "hunter2" not in stream.getvalue()
    assert "***" in lines[1]["exception"]


@pytest.mark.timeout(60)
async def test_serve_logs_start_recovery_and_stop_as_json(tmp_path: Path) -> None:
    env = {**os.environ, "SESSIONRT_SERVER_PASSWORD": "top-secret-pw"}
    async with serving(tmp_path / "data", "--log-format", "json", env=env) as served:
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.stderr is not None
        err = (await asyncio.wait_for(served.proc.stderr.read(), 30)).decode()
    lines = [json.loads(line) for line in err.splitlines()]
    phases = [line.get("phase") for line in lines]
    assert phases == ["start", "recovery", "stop", "stopped"], err
    assert lines[0]["password"] is True
    assert "top-secret-pw" not in err


async def test_metrics_and_health_are_in_the_openapi_document(client: Client) -> None:
    doc = await (await client.get("/doc")).json()
    metrics = doc["paths"]["/metrics"]["get"]
    assert list(metrics["responses"]["200"]["content"]) == ["text/plain"]
    health = doc["paths"]["/health"]["get"]["responses"]
    schema = health["200"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    assert schema["properties"]["healthy"] == {"type": "boolean"}
    assert "StorageUnavailableError" in health["503"]["description"]


def test_a_503_worth_retrying_says_when() -> None:
    from protocol.errors import ServiceUnavailableError, StorageUnavailableError
    from server.app import _error

    other_host = ServiceUnavailableError("host h did not answer", service="execution")
    assert _error(other_host).headers["Retry-After"] == "1"
    assert _error(StorageUnavailableError("disk full")).headers["Retry-After"] == "5"
    # Not every 503 is a matter of time (a store open read-only stays so).
    read_only = ServiceUnavailableError("the store is not open for writing", service="storage")
    assert "Retry-After" not in _error(read_only).headers
