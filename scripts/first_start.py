"""How long a newcomer waits: a fresh clone, ``scripts/serve``, the first answer.

    python3 scripts/first_start.py [--baseline-full] [--json]

Clones this repository's HEAD (committed work only) into a temporary
directory, points ``PIP_CACHE_DIR`` at an empty directory and
``XDG_DATA_HOME`` at a fresh one, and starts ``scripts/serve`` there (it makes
``.venv`` and installs the runtime). The clock runs from the start of
``scripts/serve`` until a prompt's execution has succeeded: ``/health``
answers, a session is created, ``hello`` is prompted and its log followed to
``session.execution.succeeded``. Target: at most 30 s.

Baselines from the same run: the same clone started again (``.venv`` made:
what each later start costs), and with ``--baseline-full`` a fresh virtual
environment filled the way scripts/serve did before it installed only what it
needs (``.[test,dev,postgres]``, again with an empty pip cache).

Standard library only, run with the system Python 3.11+.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 30.0
DEADLINE_S = 600.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _first_answer(base: str, server: subprocess.Popen[bytes], started: float) -> float:
    """Seconds from ``started`` to the first prompt's succeeded execution."""
    while True:
        if server.poll() is not None:
            raise SystemExit(f"scripts/serve exited with {server.returncode} before answering")
        if time.monotonic() - started > DEADLINE_S:
            raise SystemExit(f"no answer within {DEADLINE_S:.0f} s")
        try:
            _call(f"{base}/health")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.05)  # a measuring script waits for a server that is not up yet
    session = _call(f"{base}/api/session", {"title": "first start"})["data"]["id"]
    _call(f"{base}/api/session/{session}/prompt", {"text": "hello"})
    url = f"{base}/api/experimental/session/{session}/log?follow=true"
    with urllib.request.urlopen(url, timeout=60) as stream:
        for line in stream:
            if line.strip() == b"event: session.execution.succeeded":
                return time.monotonic() - started
    raise SystemExit("the log ended before the execution succeeded")


def _run_serve(clone: Path, env: dict[str, str]) -> float:
    port = _free_port()
    started = time.monotonic()
    server = subprocess.Popen(
        [str(clone / "scripts" / "serve"), "--port", str(port)],
        cwd=clone,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        return _first_answer(f"http://127.0.0.1:{port}", server, started)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
        try:
            _, err = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            _, err = server.communicate()
        if server.returncode not in (0, -signal.SIGINT, 130):
            sys.stderr.write(err.decode(errors="replace"))


def _full_install(work: Path, env: dict[str, str]) -> float:
    venv = work / "full-venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "-e",
            ".[test,dev,postgres]",
        ],
        cwd=work / "clone",
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-full", action="store_true", help="also time the full install")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="sessionrt-first-") as tmp:
        work = Path(tmp)
        clone = work / "clone"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        (work / "pip-cache").mkdir()
        env = {
            **os.environ,
            "PIP_CACHE_DIR": str(work / "pip-cache"),
            "XDG_DATA_HOME": str(work / "data"),
        }
        env.pop("VIRTUAL_ENV", None)
        load = os.getloadavg()[0]
        cold = _run_serve(clone, env)
        warm = _run_serve(clone, env)
        venv_mb = sum(f.stat().st_size for f in (clone / ".venv").rglob("*") if f.is_file()) / 1e6
        full = None
        if args.baseline_full:
            (work / "pip-cache-full").mkdir()
            full = _full_install(work, {**env, "PIP_CACHE_DIR": str(work / "pip-cache-full")})
    figures = {
        "commit": head,
        "cold_first_answer_s": round(cold, 2),
        "warm_first_answer_s": round(warm, 2),
        "venv_mb": round(venv_mb, 1),
        "full_install_s": None if full is None else round(full, 2),
        "target_s": TARGET_S,
        "load_average_1m": round(load, 2),
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"first start of {head} (load average {load:.2f}):")
        print(f"  cold scripts/serve to first answer: {cold:.1f} s (target <= {TARGET_S:.0f} s)")
        print(f"  warm (.venv made), same clone:      {warm:.1f} s ({cold / warm:.1f}x)")
        print(f"  .venv size:                         {venv_mb:.0f} MB")
        if full is not None:
            print(f"  baseline: venv + .[test,dev,postgres] install alone: {full:.1f} s")
    return 0 if cold <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
