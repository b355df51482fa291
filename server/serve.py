"""Running the app as a server: bind, report, and shut down gracefully on signals.

SIGINT/SIGTERM: stop accepting connections, end every stream at once (feed
subscribers get ``server.instance.disposed``, log followers the end of their
stream; each gets ``shutdown_grace_s`` to take it), then interrupt running
executions with reason ``shutdown`` (their claims stay, so the next start
recovers them), flush and close the store. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import ipaddress
import logging
import os
import platform
import resource
import signal
import sys
from typing import Final, TextIO

import attrs
from aiohttp import web

from actors.runtime import RuntimeConfig
from server._protocol import make_runner
from server.app import RUNTIME, ServerSettings, make_app, runner_options
from storage import redact

__all__ = ["is_loopback", "serve"]

log = logging.getLogger("sessionrt.server")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host == ""
    return True


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _raise_descriptor_limit() -> None:
    """Use the hard limit of open files, not the (often 1,024) soft one.

    Every connection is a descriptor; stalled clients are closed by the header
    and body timeouts, but until then a soft limit of 1,024 lets a thousand of
    them stop the server from accepting anyone else.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        # A limit we may not raise: keep the one we have.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


#: glibc's mallopt parameter: allocations at least this large get their own mapping.
_M_MMAP_THRESHOLD: Final = -3
#: 128 KiB, glibc's initial threshold, fixed (see :func:`_return_large_frees`).
_MMAP_THRESHOLD_BYTES: Final = 128 * 1024


def _return_large_frees() -> None:
    """Give large freed blocks back to the system at once (glibc only).

    glibc raises its mmap threshold each time a mapped block is freed, so
    after a few 1 MB prompts every later large string (a prompt, a body, a
    history read) came from the heap instead, whose freed space stays
    resident: 150 prompts of 1 MB left the server at 680 MiB with 75 MiB in
    use. Setting the threshold fixes it where it starts; a large block then
    costs a mapping, nothing next to what it carries.
    """
    if platform.libc_ver()[0] != "glibc":
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


async def serve(
    config: RuntimeConfig,
    settings: ServerSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 4096,
    out: TextIO = sys.stdout,
    ready: asyncio.Event | None = None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            # A second signal: the operator does not want to wait for a clean stop.
            os._exit(130)
        stop.set()

    # Signals are ours from the first moment: a SIGTERM during start-up still
    # gets the orderly stop below.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    if not is_loopback(host) and not settings.password:
        print(
            f"sessionrt: WARNING: listening on {host} without a password; anyone who can"
            " reach it can run sessions. Set SESSIONRT_SERVER_PASSWORD or --password.",
            file=sys.stderr,
            flush=True,
        )
    if not _is_address(host) and host not in settings.allowed_hosts:
        # The name the operator bound to is a name clients will send as Host.
        settings = attrs.evolve(settings, allowed_hosts=[*settings.allowed_hosts, host])
    _raise_descriptor_limit()
    _return_large_frees()
    app = make_app(config=config, settings=settings)
    runner = make_runner(app, **runner_options(settings))
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in str(bound[0]) else bound[0]
        print(f"sessionrt listening on http://{shown}:{bound[1]}", file=out, flush=True)
        print(f"  data: {_data(config)}", file=out, flush=True)
        # Which host this is, in GET /api/session/active and the fences.
        print(f"  host: {app[RUNTIME].host_id}", file=out, flush=True)
        _log_start(app, f"http://{shown}:{bound[1]}", config, settings)
        # Everything allocated so far lives as long as the server: keep it out of
        # the collector's generations so full collections stay short (a full
        # pass over start-up objects was the largest event-loop stall measured).
        gc.freeze()
        if ready is not None:
            ready.set()
        await stop.wait()
        print("sessionrt: shutting down", file=out, flush=True)
        log.info("server stopping", extra={"fields": {"phase": "stop"}})
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        log.info("server stopped", extra={"fields": {"phase": "stopped"}})


def _data(config: RuntimeConfig) -> str:
    """Where the log lives, fit to print (a database URL without its password)."""
    return str(config.db_path) if config.database is None else redact(config.database)


def _log_start(
    app: web.Application, url: str, config: RuntimeConfig, settings: ServerSettings
) -> None:
    log.info(
        "server started",
        extra={
            "fields": {
                "phase": "start",
                "url": url,
                "data": _data(config),
                "host": app[RUNTIME].host_id,
                "password": settings.password is not None,  # whether one is set; never its value
            }
        },
    )
    report = app[RUNTIME].recovery
    counts = {name: len(getattr(report, name)) for name in attrs.fields_dict(type(report))}
    log.info("recovery", extra={"fields": {"phase": "recovery", **counts}})
