"""``GET /metrics`` (Prometheus text format) and ``GET /health``.

Almost every figure is read from what the store has already committed: the
metrics subscribe to the recorder and count durable events by type
(admissions, deliveries, executions by outcome, steps, tool calls by
outcome, retries). That costs one dictionary look-up per committed event on
the event loop, after COMMIT, outside every critical section; nothing on the
write path waits for a metric. The store reports each batch (its size and
the time from hand-off to the writer until its outcome came back) through
one callback. Gauges that are cheaper to read when scraped (sessions
running, open streams) are computed then.

prometheus-client's metric objects take a (threading) lock per update; on
the one event-loop thread that lock is never contended.

The registry is per app (not the library's global one), so several servers
in one process (tests, an embedding host) each count their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from storage import RecordedEvent, Store

__all__ = ["CONTENT_TYPE", "HealthProbe", "Metrics"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

_EXECUTION_OUTCOMES: Final = {
    "session.execution.succeeded": "succeeded",
    "session.execution.failed": "failed",
    "session.execution.interrupted": "interrupted",
}
_TOOL_OUTCOMES: Final = {"session.tool.success": "success", "session.tool.failed": "failed"}
_BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class Metrics:
    """The server's metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.admissions = Counter(
            "sessionrt_admissions", "Inbox items admitted (prompts, synthetic, ...)", registry=r
        )
        self.deliveries = Counter(
            "sessionrt_deliveries", "Inbox items delivered into the transcript", registry=r
        )
        self.executions = Counter(
            "sessionrt_executions", "Executions ended, by outcome", ["outcome"], registry=r
        )
        self.steps = Counter("sessionrt_steps", "Model steps started", registry=r)
        self.tool_calls = Counter(
            "sessionrt_tool_calls", "Tool calls settled, by outcome", ["outcome"], registry=r
        )
        self.retries = Counter("sessionrt_retries", "Model retries scheduled", registry=r)
        self.active_sessions = Gauge(
            "sessionrt_active_sessions", "Sessions with a running execution", registry=r
        )
        self.subscribers = Gauge(
            "sessionrt_sse_subscribers",
            "Open SSE streams: the instance feed (event) and session logs (log)",
            ["stream"],
            registry=r,
        )
        self.batch_size = Histogram(
            "sessionrt_store_batch_commands",
            "Commands per store commit (group commit)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.commit_latency = Histogram(
            "sessionrt_store_commit_seconds",
            "From a batch's hand-off to the writer until its outcome is back on the loop",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Children looked up once: the per-event path is a dict get and an inc.
        self._by_type: dict[str, Callable[[], None]] = {
            "session.inbox.enqueued": self.admissions.inc,
            "session.inbox.delivered": self.deliveries.inc,
            "session.step.started": self.steps.inc,
            "session.retry.scheduled": self.retries.inc,
        }
        for type_, outcome in _EXECUTION_OUTCOMES.items():
            self._by_type[type_] = self.executions.labels(outcome).inc
        for type_, outcome in _TOOL_OUTCOMES.items():
            self._by_type[type_] = self.tool_calls.labels(outcome).inc

    def committed(self, records: Sequence[RecordedEvent]) -> None:
        """The recorder's subscriber: count a committed batch's events."""
        by_type = self._by_type
        for record in records:
            event = record.event
            if event is not None:
                count = by_type.get(event.TYPE)
                if count is not None:
                    count()

    def batch(self, commands: int, seconds: float) -> None:
        """The store's batch observer."""
        self.batch_size.observe(commands)
        self.commit_latency.observe(seconds)

    def render(self, *, active: int, feed: int, logs: int) -> bytes:
        self.active_sessions.set(active)
        self.subscribers.labels("event").set(feed)
        self.subscribers.labels("log").set(logs)
        return generate_latest(self.registry)


class HealthProbe:
    """At most one probe at a time; concurrent ``/health`` calls share its answer.

    ``run`` runs a blocking function off the loop (the runtime's bounded
    blocking runner, which owns and ends its threads).
    """

    def __init__(
        self, store: Store, run: Callable[..., Awaitable[None]], timeout_s: float = 2.0
    ) -> None:
        self._store = store
        self._run = run
        self._timeout_s = timeout_s
        self._running: asyncio.Task[None] | None = None

    async def check(self) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._probe(), name="health-probe")
        # shield: a health client that hangs up must not cancel the shared probe.
        await asyncio.shield(self._running)

    async def _probe(self) -> None:
        await self._store.check_writable(self._timeout_s, self._run)

    async def aclose(self) -> None:
        if self._running is not None and not self._running.done():
            self._running.cancel()
            with contextlib.suppress(BaseException):
                await self._running
