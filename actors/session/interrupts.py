"""An interrupt a host receives for a session another host runs: sent there, answered, retried.

Host messages are at most once (:mod:`actors.host_messages`): a notice to a host
whose connection to the server is being re-made is lost. A lost wake costs
nothing (the input stays admitted); a lost interrupt would leave the
execution running while the user was told it stopped. So an interrupt
carries a request id, the owner answers it with what its own interrupt
returned, and the sender sends it again until the answer comes or
:data:`WAIT_S` is over (then a 503: nothing is known, and the client may try
again). Between sends it looks where the session runs now: an owner that
stalled past its lease expiry never answers, and the host that took the
session over (this one, or another) runs the continuation the user meant to
stop. Taken over here, it is interrupted here; by another host, the request
goes there; run nowhere any more (no claim left), the target is asked once
more (its answer may be the one lost) and then the answer is no.

The owner remembers the answers it gave (:data:`REMEMBERED`, by count), so a
request it sees twice (its answer was the one lost) is answered again, not
acted on again: a second interrupt could stop the *next* execution, started
since by new input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, Final, Protocol

from actors.host_messages import HostBus, HostMessage
from protocol.errors import ServiceUnavailableError
from storage.clock import SYSTEM, Clock
from storage.errors import StorageError

__all__ = ["PENDING", "REMEMBERED", "UNHELD", "WAIT_S", "LocalHost", "RemoteInterrupts"]

log = logging.getLogger(__name__)

#: Seconds a sender waits for the owner's answer, resending meanwhile: longer
#: than a lost connection takes to be noticed (a ping, 5 s) and re-made.
WAIT_S: Final = 10.0
#: First pause before a resend; it doubles up to :data:`_RESEND_MAX_S`.
_RESEND_S: Final = 0.25
_RESEND_MAX_S: Final = 1.0
#: Interrupts waiting for an answer at once, per host (more: a 503).
PENDING: Final = 1024
#: Answers an owner keeps for requests seen again (by count, oldest out).
REMEMBERED: Final = 1024

#: ``locate``: claimed, but no other host holds the session's live lease.
UNHELD: Final = ""


class LocalHost(Protocol):
    """What the remote interrupts need of this host (the runtime's execution)."""

    async def interrupt_here(self, session_id: str) -> bool:
        """This host's own interrupt: True when it stopped an execution."""
        ...

    def spawn(self, work: Coroutine[Any, Any, object], name: str) -> None:
        """Run a task the runtime owns."""
        ...

    async def locate(self, session_id: str) -> str | None:
        """The other host holding the session's live lease; :data:`UNHELD`
        when it is claimed but no other host holds it (its owner's lease
        expired and nobody took it over yet, or this host did); None when it
        is not claimed (it runs nowhere)."""
        ...


class RemoteInterrupts:
    """Both ends: :meth:`send` on the host that received the interrupt,
    :meth:`on_message` on every host for ``interrupt`` and ``answer`` messages."""

    def __init__(
        self,
        host_id: str,
        bus: HostBus,
        local: LocalHost,
        *,
        wait_s: float = WAIT_S,
        clock: Clock = SYSTEM,
    ) -> None:
        #: What the wait for an answer, and the pauses between resends, are measured on.
        self._clock = clock
        self._host_id = host_id
        self._bus = bus
        self._interrupt = local.interrupt_here
        self._spawn = local.spawn
        self._locate = local.locate
        self.wait_s = wait_s
        self._waiting: dict[str, asyncio.Future[bool]] = {}
        #: request id -> the answer given; None while it is being worked out.
        self._answers: OrderedDict[str, bool | None] = OrderedDict()

    @property
    def waiting(self) -> int:
        """Interrupts sent from here still waiting for their answer."""
        return len(self._waiting)

    async def send(self, owner: str, session_id: str) -> bool:
        """Interrupt ``session_id`` on ``owner``; its answer (True: it stopped one)."""
        if len(self._waiting) >= PENDING:
            raise ServiceUnavailableError(
                f"{PENDING} interrupts already wait for other hosts' answers",
                service="execution",
            )
        request = secrets.token_hex(8)
        answered: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting[request] = answered
        message = HostMessage(
            kind="interrupt", origin=self._host_id, session_ids=(session_id,), request=request
        )
        pause, target, ended = _RESEND_S, owner, False
        try:
            async with self._clock.timeout(self.wait_s):
                while True:
                    try:
                        await self._bus.publish(target, message)
                    except StorageError as exc:
                        log.warning("interrupt for %s not sent to %s: %s", session_id, target, exc)
                    with contextlib.suppress(TimeoutError):
                        async with self._clock.timeout(pause):
                            return await asyncio.shield(answered)
                    pause = min(pause * 2, _RESEND_MAX_S)
                    if ended:
                        return False  # it ran nowhere, and no answer came since
                    if await self._interrupt(session_id):
                        return True  # taken over here meanwhile: stopped here
                    try:
                        where = await self._locate(session_id)
                    except StorageError as exc:
                        log.warning("cannot tell where %s runs: %s", session_id, exc)
                        continue
                    if where is None:
                        # It runs nowhere any more. Once more to the target, whose
                        # answer may be what was lost; never to another host (what
                        # runs there later is not what the user meant to stop).
                        ended = True
                    elif where != UNHELD:
                        target = where  # the same request: each host acts on it once
        except TimeoutError:
            raise ServiceUnavailableError(
                f"host {target}, which runs the session, did not answer the interrupt"
                f" within {self.wait_s:g} s",
                service="execution",
            ) from None
        finally:
            del self._waiting[request]

    def on_message(self, message: HostMessage) -> None:
        if message.kind == "answer":
            waiting = self._waiting.get(message.request)
            if waiting is not None and not waiting.done():
                waiting.set_result(message.answer)
        elif message.kind == "interrupt":
            for session_id in message.session_ids:
                self._on_request(message, session_id)

    def _on_request(self, message: HostMessage, session_id: str) -> None:
        if not message.request:  # nobody waits for an answer
            self._spawn(self._interrupt(session_id), f"interrupt:{session_id}")
            return
        if message.request in self._answers:
            given = self._answers[message.request]
            if given is not None:  # the answer was lost: the same one again
                self._spawn(self._answer(message, session_id, given), f"answer:{session_id}")
            return  # else still being worked out: the answer goes when it is
        self._answers[message.request] = None
        while len(self._answers) > REMEMBERED:
            self._answers.popitem(last=False)
        self._spawn(self._act(message, session_id), f"interrupt:{session_id}")

    async def _act(self, message: HostMessage, session_id: str) -> None:
        try:
            stopped = await self._interrupt(session_id)
        except Exception:
            self._answers.pop(message.request, None)  # a resend tries again
            log.exception("interrupting %s for host %s failed", session_id, message.origin)
            return
        except BaseException:
            self._answers.pop(message.request, None)
            raise
        if message.request in self._answers:
            self._answers[message.request] = stopped
        await self._answer(message, session_id, stopped)

    async def _answer(self, message: HostMessage, session_id: str, stopped: bool) -> None:
        answer = HostMessage(
            kind="answer",
            origin=self._host_id,
            session_ids=(session_id,),
            request=message.request,
            answer=stopped,
        )
        try:
            await self._bus.publish(message.origin, answer)
        except StorageError as exc:
            # The sender resends the request and gets the remembered answer.
            log.warning("the answer to an interrupt for %s not sent: %s", session_id, exc)
