"""The session actor: who runs a session's drains, when, and how a busy period ends.

A **busy period** is one execution of a session: it starts (``started``: the
durable ``session.execution.started`` with its write-ahead claim), runs one or
more drains, and settles (``settled``: exactly one terminal event) before any
waiter is told. The rules are those of the original's run coordinator:

- ``wake`` while idle starts a busy period (its first drain runs one tick
  later); wakes during a busy period ring a doorbell, and any number of rings
  cause exactly one more drain. The widest scope wins (``input`` over
  ``steer``); a scope consumed by a drain is not carried into the next one.
- ``resume`` joins the active busy period and returns its terminal; while
  idle it starts one (forced); while stopping it waits for cleanup and starts
  a forced successor. A waiter that gives up does not cancel the execution.
- ``interrupt`` is a no-op (False) when idle or already stopping; during the
  settlement window it only clears the doorbell; otherwise it clears the
  doorbell (those wakes belonged to the cancelled intent), records the reason
  and cancels the drains, answering True before cleanup finishes. A wake or
  resume that arrives during cleanup starts a successor at settlement.
- Different sessions run concurrently; drains loop instead of recursing, so a
  self-waking session keeps a flat stack.

Each session's state lives in its own :class:`SessionActor`; the
:class:`Supervisor` actor routes to them, creates them on demand and retires
them when idle (an idle session costs no actor at all). :class:`Execution` is
the synchronous/async facade the rest of the runtime calls.

Terminal classification: success -> ``succeeded``; an interrupt with reason
``user`` -> ``interrupted(user)``; cancellation without a reason (teardown)
-> ``interrupted(shutdown)``; any other exception -> ``failed {type, message}``.

Several hosts (see :mod:`storage.lease`): ``started`` takes the session's
lease. When another host holds it live (:class:`~storage.LeaseHeldError`)
the busy period ends at once as ``elsewhere`` (naming the owner, the scope
and whether it was forced) and nothing is written: the hooks forward the
work to the owner. When this host loses the lease while it works (a
:class:`~storage.FencedError` from an append, or ``lease_lost`` from the
renewal) the drains are cancelled and the busy period ends as ``fenced``:
the terminal belongs to whoever holds the lease now, so none is written.

The session actor is also the only writer of its session: every write
(admission, cancel, delivery change, promotion, control delivery, revert,
shell notice, permission reply, agent/model/title change, deletion) is a
:class:`SessionCommand` it runs between two other messages, and its drain
(:mod:`.drain`, the busy period's child task) asks it for each boundary's
read and promotion. An actor lives while it has a command or a busy period.

Modules: :mod:`.messages` (terminals, hooks, messages), :mod:`.actor` (the
session actor), :mod:`.drain` (what a busy period runs) and what only the
session actor and its drain call: :mod:`.inbox` (admission and the delivery
rules), :mod:`.step`, :mod:`.tool_calls`, :mod:`.compaction`, :mod:`.history`,
:mod:`.instruction_admission`, :mod:`.revert`, :mod:`.shells`, :mod:`.interrupts`.
The supervisor and the facade (:class:`~actors.supervisor.Execution`) are
:mod:`actors.supervisor`.
"""

from actors.session.actor import SessionActor
from actors.session.messages import (
    ExecutionHooks,
    Own,
    SessionCommand,
    Terminal,
    error_info,
    widest,
)

__all__ = [
    "ExecutionHooks",
    "Own",
    "SessionActor",
    "SessionCommand",
    "Terminal",
    "error_info",
    "widest",
]
