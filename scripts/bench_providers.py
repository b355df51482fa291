#!/usr/bin/env python3
"""The provider adapters' cost: per chunk, per step, end to end, and in memory.

    .venv/bin/python scripts/bench_providers.py            # table
    .venv/bin/python scripts/bench_providers.py --json     # one JSON object on stdout
    .venv/bin/python scripts/bench_providers.py --steps 30 --quiet

A zero-latency streaming server runs in its own process (this script with
``--serve-fake``): it answers ``POST /v1/chat/completions`` (OpenAI format) and
``POST /v1/messages`` (Anthropic format) with ``x-chunks`` pre-rendered text
deltas, each written on its own. Against it, in one run:

1. **Per chunk.** A 2,000-chunk answer read by a *bare aiohttp client* (POST,
   ``readany``, split lines, ``orjson.loads`` each ``data:`` line: the least any
   client must do) and by each adapter (:class:`OpenAIProvider`,
   :class:`AnthropicProvider`, consuming every normalized part), alternating,
   ``--reps`` times; median µs per chunk, and the overhead as the median of
   the paired differences (each adapter read runs right after a bare one). If
   the ``openai`` package is importable (it is not a dependency: ``pip install
   openai`` into .venv to see it), the SDK's ``AsyncOpenAI`` streaming the same
   answer is measured too.
2. **Per step, the stream alone.** A 200-chunk answer, bare client vs adapter,
   ``--steps`` times each, alternating: p50/p99 ms; the adapter's overhead per
   step is the p50 of the paired differences.
3. **Per step, end to end.** prompt → ``execution.succeeded`` for a 1-step
   200-chunk answer through a real runtime (temp data dir, ``synchronous=FULL``)
   on each adapter, next to the scripted model streaming 200 chunks of the same
   text (``#chunk``) in the same runtime.
4. **Memory.** VmRSS of a ``sessionrt serve`` process with both adapters
   configured after one answer through each, next to the same server with no
   providers after one scripted answer; and, if the SDKs are importable, the RSS
   a bare interpreter gains by importing ``openai`` and ``anthropic``.

Targets (informational; 2 cores): per-chunk overhead over the bare client
<= 30 µs, per-step overhead over the bare client <= 3 ms p50, server RSS with
both adapters <= 90 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson
from _benchlib import report_main, target_lines
from aiohttp import web

from actors.llm import (
    AnthropicProvider,
    ModelLimits,
    ModelRequest,
    OpenAIProvider,
    ProviderConfig,
    TextContent,
)
from actors.llm._request import ChatMessage
from actors.runtime import Runtime, RuntimeConfig
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import ModelRef

ROOT: Final = Path(__file__).resolve().parent.parent
TARGET_CHUNK_US: Final = 30.0
TARGET_STEP_MS: Final = 3.0
TARGET_RSS_MIB: Final = 90.0
PIECE: Final = "word "  # one delta's text


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench_providers] {message}", file=sys.stderr, flush=True)


# -- the zero-latency server (its own process) -------------------------------------------------


def _openai_frames(n: int) -> list[bytes]:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return b"data: " + orjson.dumps({**head, "choices": [choice], "usage": None}) + b"\n\n"

    usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}
    return [
        *(chunk({"content": PIECE}, None) for _ in range(n)),
        chunk({}, "stop"),
        b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n",
        b"data: [DONE]\n\n",
    ]


def _anthropic_frames(n: int) -> list[bytes]:
    def frame(event: dict[str, Any]) -> bytes:
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    start = {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 10}}}
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}
    delta["delta"]["text"] = PIECE  # type: ignore[index]
    return [
        frame(start),
        frame({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        *(frame(delta) for _ in range(n)),
        frame({"type": "content_block_stop", "index": 0}),
        frame({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}}),
        frame({"type": "message_stop"}),
    ]


def serve_fake() -> int:
    cache: dict[tuple[str, int], list[bytes]] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        n = int(request.headers.get("x-chunks", "200"))
        kind = "openai" if request.path.endswith("/chat/completions") else "anthropic"
        frames = cache.get((kind, n))
        if frames is None:
            frames = (_openai_frames if kind == "openai" else _anthropic_frames)(n)
            cache[(kind, n)] = frames
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for frame in frames:
            await response.write(frame)
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        app.router.add_post("/v1/messages", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(port, flush=True)
        # Runs until stdin closes: the parent owns this process's lifetime.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()

    asyncio.run(main())
    return 0


# -- measuring ---------------------------------------------------------------------------------


def _config(pid: str, kind: str, root: str, chunks: int) -> ProviderConfig:
    return ProviderConfig(
        id=pid,
        kind=kind,  # type: ignore[arg-type]
        base_url=f"{root}/v1" if kind == "openai" else root,
        headers={"x-chunks": str(chunks)},
        models={"m": ModelLimits(context=128_000, output=4096)},
    )


def _request(pid: str) -> ModelRequest:
    return ModelRequest(
        session_id="ses_bench",
        agent="build",
        model=ModelRef(id="m", provider_id=pid),
        messages=(ChatMessage(role="user", parts=(TextContent(text="go"),)),),
    )


async def bare_read(http: aiohttp.ClientSession, url: str, chunks: int) -> int:
    """The least a client does: POST, read, split lines, decode each data line."""
    count = 0
    rest = b""
    async with http.post(url, data=b'{"stream": true}', headers={"x-chunks": str(chunks)}) as r:
        while True:
            data = await r.content.readany()
            if not data:
                break
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    orjson.loads(line[6:])
                    count += 1
    return count


async def adapter_read(provider: OpenAIProvider | AnthropicProvider, pid: str) -> int:
    count = 0
    async for _part in provider.stream(_request(pid)):
        count += 1
    return count


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def per_chunk(root: str, args: argparse.Namespace) -> dict[str, Any]:
    n = args.chunk_count
    out: dict[str, Any] = {"chunks": n}
    async with aiohttp.ClientSession() as http:
        for kind, path in (("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")):
            provider = (OpenAIProvider if kind == "openai" else AnthropicProvider)(
                _config(kind, kind, root, n)
            )
            bare: list[float] = []
            ours: list[float] = []
            try:
                for _ in range(args.reps + 1):  # the first of each is a warm-up
                    bare.append(await timed(functools.partial(bare_read, http, root + path, n)))
                    ours.append(await timed(functools.partial(adapter_read, provider, kind)))
            finally:
                await provider.aclose()
            # Pairs run back to back, so the median of their differences is
            # the figure least moved by other load on a shared machine.
            diffs = [a - b for a, b in zip(ours[1:], bare[1:], strict=True)]
            out[kind] = {
                "bare_us": statistics.median(bare[1:]) / n * 1e6,
                "adapter_us": statistics.median(ours[1:]) / n * 1e6,
                "overhead_us": statistics.median(diffs) / n * 1e6,
            }
    out["openai_sdk_us"] = await _sdk_per_chunk(root, args)
    return out


async def _sdk_per_chunk(root: str, args: argparse.Namespace) -> float | None:
    try:
        import openai
    except ImportError:
        return None
    n = args.chunk_count
    client = openai.AsyncOpenAI(
        base_url=f"{root}/v1",
        api_key="bench",
        max_retries=0,
        default_headers={"x-chunks": str(n)},
    )

    async def read() -> None:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], stream=True
        )
        async for _chunk in stream:
            pass

    try:
        times = [await timed(read) for _ in range(args.reps + 1)]
    finally:
        await client.close()
    return statistics.median(times[1:]) / n * 1e6


async def per_step_stream(root: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        for kind, path in (("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")):
            provider = (OpenAIProvider if kind == "openai" else AnthropicProvider)(
                _config(kind, kind, root, args.step_chunks)
            )
            bare: list[float] = []
            ours: list[float] = []
            try:
                for i in range(args.steps + 5):
                    b = await timed(
                        functools.partial(bare_read, http, root + path, args.step_chunks)
                    )
                    a = await timed(functools.partial(adapter_read, provider, kind))
                    if i >= 5:
                        bare.append(b * 1e3)
                        ours.append(a * 1e3)
            finally:
                await provider.aclose()
            diffs = [a - b for a, b in zip(ours, bare, strict=True)]
            out[kind] = {
                "overhead_p50_ms": _pct(diffs, 0.5),
                "bare_p50_ms": _pct(bare, 0.5),
                "bare_p99_ms": _pct(bare, 0.99),
                "adapter_p50_ms": _pct(ours, 0.5),
                "adapter_p99_ms": _pct(ours, 0.99),
            }
    return out


async def end_to_end(root: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    n = args.step_chunks
    configs = {k: _config(k, k, root, n) for k in ("openai", "anthropic")}
    script = f"#chunk {len(PIECE)}\n#text {PIECE * n}"
    config = RuntimeConfig(
        data_dir=tmp / "e2e", default_directory=str(tmp), provider_configs=configs
    )
    times: dict[str, list[float]] = {"scripted": [], "openai": [], "anthropic": []}
    async with Runtime(config) as rt:
        sessions = {}
        for name in times:
            model = None if name == "scripted" else ModelRef(id="m", provider_id=name)
            created = await rt.sessions.create(CreateSessionInput(model=model))
            sessions[name] = created.id
        for i in range(args.steps + 3):
            for name, sid in sessions.items():
                text = script if name == "scripted" else "go"
                start = time.perf_counter()
                await rt.sessions.prompt(sid, PromptInput(text=text, resume=False))
                terminal = await rt.execution.resume(sid)
                elapsed = (time.perf_counter() - start) * 1e3
                if terminal.kind != "succeeded":
                    raise RuntimeError(f"{name}: the step ended {terminal.kind}: {terminal.error}")
                if i >= 3:
                    times[name].append(elapsed)
    return {k: {"p50_ms": _pct(v, 0.5), "p99_ms": _pct(v, 0.99)} for k, v in times.items()}


# -- memory ------------------------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def server_rss(root: str, tmp: Path, with_providers: bool) -> float:
    exe = Path(sys.executable).with_name("sessionrt")
    config = tmp / f"rss-{with_providers}.toml"
    text = ""
    if with_providers:
        for kind in ("openai", "anthropic"):
            base = f"{root}/v1" if kind == "openai" else root
            text += (
                f'[providers.{kind}]\nkind = "{kind}"\nbase_url = "{base}"\n'
                f'headers = {{ "x-chunks" = "200" }}\n'
                f"[providers.{kind}.models.m]\ncontext = 128000\noutput = 4096\n\n"
            )
    config.write_text(text)
    data = tmp / f"rss-data-{with_providers}"
    proc = await asyncio.create_subprocess_exec(
        str(exe),
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data),
        "--config",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = line[line.index("http://") :].split()[0]
        models = [{"providerID": k, "id": "m"} for k in ("openai", "anthropic")]
        async with aiohttp.ClientSession() as http:
            for model in models if with_providers else [None]:
                body = {"model": model} if model else {}
                async with http.post(f"{url}/api/session", json=body) as r:
                    sid = (await r.json())["data"]["id"]
                async with http.post(f"{url}/api/session/{sid}/prompt", json={"text": "go"}) as r:
                    r.raise_for_status()
                async with http.post(f"{url}/api/experimental/session/{sid}/wait") as r:
                    r.raise_for_status()
        return _rss_mib(proc.pid)
    finally:
        proc.terminate()
        await proc.wait()


def sdk_import_rss() -> dict[str, float] | None:
    code = (
        "import sys, aiohttp, orjson\n"
        "def rss():\n"
        "    for l in open('/proc/self/status'):\n"
        "        if l.startswith('VmRSS:'): return int(l.split()[1]) / 1024\n"
        "base = rss()\n"
        "try:\n    import openai, anthropic\nexcept ImportError:\n    print('none'); sys.exit()\n"
        "print(base, rss())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    if done.stdout.strip() == "none":
        return None
    base, loaded = (float(x) for x in done.stdout.split())
    return {"bare_mib": base, "with_sdks_mib": loaded}


# -- the report --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fake_server() -> AsyncIterator[str]:
    """The zero-latency server in its own process; stopped by closing its stdin."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve-fake",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        port = int(await asyncio.wait_for(proc.stdout.readline(), 30))
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _figure(
    name: str, value: float | None, unit: str, baseline: float | None, label: str, **target: Any
) -> dict[str, Any]:
    ratio = value / baseline if value is not None and baseline else None
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_label": label,
        "ratio": ratio,
        **target,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-providers-") as tmp_name:
        tmp = Path(tmp_name)
        async with fake_server() as root:
            _log(args, f"per chunk: {args.chunk_count}-chunk answers x {args.reps}")
            chunk = await per_chunk(root, args)
            _log(args, f"per step, stream only: {args.step_chunks} chunks x {args.steps}")
            stream = await per_step_stream(root, args)
            _log(args, f"per step, end to end: {args.step_chunks} chunks x {args.steps}")
            e2e = await end_to_end(root, args, tmp)
            _log(args, "server RSS, with and without providers")
            rss_with = await server_rss(root, tmp, with_providers=True)
            rss_without = await server_rss(root, tmp, with_providers=False)
    sdk_rss = sdk_import_rss()
    figures: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for kind in ("openai", "anthropic"):
        c = chunk[kind]
        over = c["overhead_us"]
        ok = over <= TARGET_CHUNK_US
        figures.append(
            _figure(
                f"{kind} adapter, per chunk",
                c["adapter_us"],
                "us",
                c["bare_us"],
                "bare aiohttp + orjson reader",
            )
        )
        name = f"{kind} per-chunk overhead over bare (paired median) <= {TARGET_CHUNK_US:g} us"
        figures.append(
            _figure(
                name, over, "us", None, "-", target=f"<= {TARGET_CHUNK_US:g} us", **{"pass": ok}
            )
        )
        targets.append({"name": name, "value": round(over, 2), "unit": "us", "pass": ok})
    if chunk["openai_sdk_us"] is not None:
        figures.append(
            _figure(
                "openai SDK (AsyncOpenAI), per chunk",
                chunk["openai_sdk_us"],
                "us",
                chunk["openai"]["bare_us"],
                "bare aiohttp + orjson reader",
            )
        )
    for kind in ("openai", "anthropic"):
        s = stream[kind]
        over = s["overhead_p50_ms"]
        ok = over <= TARGET_STEP_MS
        figures.append(
            _figure(
                f"{kind} adapter, {args.step_chunks}-chunk stream p50",
                s["adapter_p50_ms"],
                "ms",
                s["bare_p50_ms"],
                "bare client p50",
            )
        )
        figures.append(
            _figure(
                f"{kind} adapter, {args.step_chunks}-chunk stream p99",
                s["adapter_p99_ms"],
                "ms",
                s["bare_p99_ms"],
                "bare client p99",
            )
        )
        name = f"{kind} per-step overhead over bare (paired p50) <= {TARGET_STEP_MS:g} ms"
        figures.append(
            _figure(name, over, "ms", None, "-", target=f"<= {TARGET_STEP_MS:g} ms", **{"pass": ok})
        )
        targets.append({"name": name, "value": round(over, 3), "unit": "ms", "pass": ok})
    for kind in ("openai", "anthropic"):
        for q in ("p50", "p99"):
            figures.append(
                _figure(
                    f"prompt -> execution.succeeded, {kind}, {q}",
                    e2e[kind][f"{q}_ms"],
                    "ms",
                    e2e["scripted"][f"{q}_ms"],
                    f"scripted model, {args.step_chunks} chunks",
                )
            )
    ok = rss_with <= TARGET_RSS_MIB
    name = f"server RSS with both adapters <= {TARGET_RSS_MIB:g} MiB"
    figures.append(
        _figure(
            name,
            rss_with,
            "MiB",
            rss_without,
            "server without providers",
            target=f"<= {TARGET_RSS_MIB:g} MiB",
            **{"pass": ok},
        )
    )
    targets.append({"name": name, "value": round(rss_with, 1), "unit": "MiB", "pass": ok})
    if sdk_rss is not None:
        figures.append(
            _figure(
                "interpreter RSS after importing openai + anthropic",
                sdk_rss["with_sdks_mib"],
                "MiB",
                sdk_rss["bare_mib"],
                "interpreter with aiohttp + orjson",
            )
        )
    return {
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "sdk_installed": chunk["openai_sdk_us"] is not None,
        "per_chunk": chunk,
        "per_step_stream": stream,
        "end_to_end": e2e,
        "rss_mib": {"with_providers": rss_with, "without": rss_without, "sdk_import": sdk_rss},
        "figures": figures,
        "targets": targets,
    }


def _show(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.3f} {unit}" if unit == "ms" else f"{value:,.2f} {unit}"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"bench_providers: Python {report['python']}, {report['cpus']} CPUs; "
        f"openai SDK {'measured' if report['sdk_installed'] else 'not installed'}",
        "",
    ]
    width = max(len(f["name"]) for f in report["figures"])
    for f in report["figures"]:
        base = (
            ""
            if f["baseline"] is None
            else (f"   vs {_show(f['baseline'], f['unit'])} ({f['baseline_label']})")
        )
        lines.append(f"{f['name']:<{width}}  {_show(f['value'], f['unit']):>14}{base}")
    lines.append("")
    lines += target_lines(report["targets"], _show, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk-count", type=int, default=2000, help="chunks per answer, phase 1")
    parser.add_argument("--reps", type=int, default=7, help="answers per reader, phase 1")
    parser.add_argument("--step-chunks", type=int, default=200, help="chunks per step answer")
    parser.add_argument("--steps", type=int, default=50, help="steps per reader, phases 2-3")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if min(args.chunk_count, args.reps, args.step_chunks, args.steps) < 1:
        parser.error("counts must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_fake:
        return serve_fake()
    return report_main(lambda: asyncio.run(run(args)), render, as_json=args.json, hard_limit_s=900)


if __name__ == "__main__":
    sys.exit(main())
