#!/usr/bin/env python3
"""Compaction figures: the estimate's cost per step, and the time to compact a long session.

    .venv/bin/python scripts/bench_compaction.py            # table
    .venv/bin/python scripts/bench_compaction.py --json     # one JSON object on stdout
    .venv/bin/python scripts/bench_compaction.py --messages 2000 --calls 2000

One process, one event loop, a fresh temp data dir, the scripted model at zero delay.
A session with ``--messages`` transcript messages (half user prompts of about 400
characters, half scripted-style assistant replies, each step's ``step.ended`` with
reported tokens) is written straight to the store in a few large commands. Figures,
each next to a baseline measured in the same run:

1. **Estimate per step, anchored.** :meth:`actors.session.compaction.Estimator.estimate` on
   the session's active history and a request built from it, warm (what every step
   after the first pays: the newest assistant message reported its tokens, so only
   what follows it is counted). Baseline: a fresh estimator counting every message
   from scratch (what a non-incremental estimate would pay each step).
2. **Estimate per step, no anchor.** The same on a session whose steps reported no
   tokens (a provider that never says): every message counts, the unchanged prefix
   from the running sums kept per session. Baseline: the from-scratch count again.
3. **Time to compact.** ``Compactor.run`` on the whole history (tail selection, the
   serialized summary request, the scripted model's streamed summary with its live
   deltas, the durable ``started``/``ended``). Baseline: reading the active history
   once (``queries.context``) on the same store, the floor any step pays.

Target (informational): estimate <= 1 ms per step on 2,000 messages.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _benchlib import report_main, target_lines

from actors.llm import SCRIPTED_MODEL, ModelRequest
from actors.runtime import Runtime, RuntimeConfig
from actors.session.compaction import Estimator
from actors.session.history import to_chat
from protocol import events as ev
from protocol import ids
from protocol.requests import CreateSessionInput
from protocol.shapes import ModelRef
from storage import Command

ESTIMATE_TARGET_MS = 1.0


async def _fill(rt: Runtime, session_id: str, messages: int, tokens: bool) -> None:
    batch: list[ev.Event] = []
    model = ModelRef(id="scripted", provider_id="scripted")
    for n in range(messages // 2):
        uid, aid = ids.message_id(), ids.message_id()
        text = f"request {n}: " + "please look at the module and explain it. " * 9
        reply = f"Scripted reply: request {n}, looked at the module. " * 4
        reported = ev.StepTokens(input=n * 210 + 100, output=len(reply) // 4)
        batch += [
            ev.InboxEnqueued(
                session_id=session_id,
                inbox_id=uid,
                item=ev.EnqueuedItem(type="user", payload={"text": text}, delivery="steer"),
            ),
            ev.InboxDelivered(session_id=session_id, inbox_id=uid),
            ev.StepStarted(
                session_id=session_id,
                assistant_message_id=aid,
                agent="build",
                model=model,
                started=0,
            ),
            ev.TextStarted(session_id=session_id, assistant_message_id=aid, ordinal=0),
            ev.TextEnded(session_id=session_id, assistant_message_id=aid, ordinal=0, text=reply),
            ev.StepEnded(
                session_id=session_id,
                assistant_message_id=aid,
                finish="stop",
                tokens=reported if tokens else ev.StepTokens(),
            ),
        ]
        if len(batch) >= 600:
            await rt.store.append(Command.of(*batch))
            batch = []
    if batch:
        await rt.store.append(Command.of(*batch))


def _request(session_id: str, history: Any) -> ModelRequest:
    return ModelRequest(
        session_id=session_id,
        agent="build",
        model=SCRIPTED_MODEL,
        system=("You are a careful engineer.",),
        messages=to_chat(history),
    )


def _per_call_ms(fn: Any, calls: int) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) * 1000 / calls)
    return statistics.median(samples)


async def _measure(messages: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        config = RuntimeConfig(data_dir=Path(tmp) / "data", default_directory=tmp, recover=False)
        async with Runtime(config) as rt:
            anchored = await rt.sessions.create(CreateSessionInput())
            bare = await rt.sessions.create(CreateSessionInput())
            await _fill(rt, anchored.id, messages, tokens=True)
            await _fill(rt, bare.id, messages, tokens=False)
            figures = []
            for label, session in (("anchored", anchored), ("no anchor", bare)):
                history = await rt.store.queries.context(session.id)
                request = _request(session.id, history)
                warm = Estimator()
                warm.estimate(history, request)
                value = _per_call_ms(lambda h=history, r=request, w=warm: w.estimate(h, r), calls)
                cold_calls = max(1, calls // 20)
                baseline = _per_call_ms(
                    lambda h=history, r=request: Estimator().estimate(h, r, anchor=False),
                    cold_calls,
                )
                figures.append(
                    {
                        "name": f"estimate per step, {len(history):,} messages, {label}",
                        "value": value,
                        "unit": "ms",
                        "baseline": baseline,
                        "baseline_label": "every message counted from scratch",
                        "ratio": value / baseline if baseline else None,
                        "target": f"<= {ESTIMATE_TARGET_MS} ms",
                        "pass": value <= ESTIMATE_TARGET_MS,
                    }
                )
            history = await rt.store.queries.context(anchored.id)
            reads = []
            for _ in range(5):
                start = time.perf_counter()
                await rt.store.queries.context(anchored.id)
                reads.append(time.perf_counter() - start)
            start = time.perf_counter()
            failure = await rt.services.drain.compactor.run(
                anchored.id, SCRIPTED_MODEL, history, "auto"
            )
            compact_s = time.perf_counter() - start
            assert failure is None, f"the compaction did not complete: {failure}"
            read_s = statistics.median(reads)
            figures.append(
                {
                    "name": f"compact a {len(history):,}-message session (zero-latency model)",
                    "value": compact_s * 1000,
                    "unit": "ms",
                    "baseline": read_s * 1000,
                    "baseline_label": "one read of the active history",
                    "ratio": compact_s / read_s if read_s else None,
                }
            )
    targets = [
        {"name": f["name"], "value": f["value"], "unit": "ms", "pass": f["pass"]}
        for f in figures
        if "pass" in f
    ]
    return {"messages": messages, "figures": figures, "targets": targets}


def _render(report: dict[str, Any]) -> str:
    lines = [f"compaction ({report['messages']:,} messages)"]
    for f in report["figures"]:
        lines.append(
            f"  {f['name']}: {f['value']:.3f} ms"
            f"  (baseline {f['baseline']:.3f} ms, {f['baseline_label']}; {f['ratio']:.3f}x)"
        )
    lines += target_lines(report["targets"], lambda v, u: f"{v:.3f} {u}", heading="targets:")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return report_main(
        lambda: asyncio.run(_measure(args.messages, args.calls)),
        _render,
        as_json=args.json,
        hard_limit_s=600,
    )


if __name__ == "__main__":
    sys.exit(main())
