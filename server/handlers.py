"""One handler per operation id: validated inputs in, domain values out.

Handlers never build HTTP responses (the app encodes outputs by the table's
output kind) except the two streams, which live in :mod:`server.sse`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from aiohttp import web

from actors.runtime import Runtime
from protocol.cursor import SessionQuery
from protocol.errors import ServiceUnavailableError
from protocol.operations import (
    ActiveSession,
    AgentInfo,
    AgentInput,
    DeliveryInput,
    DiffQuery,
    EnvironmentInput,
    ExportQuery,
    GenerateResult,
    InstructionEntryInput,
    InterruptQuery,
    InterruptResult,
    McpLocationStatus,
    McpServerStatus,
    MessagesQuery,
    ModelInfo,
    ModelInput,
    PermissionReplyInput,
    RevertStageInput,
    SessionListQuery,
    ShellInput,
)
from protocol.requests import (
    CompactInput,
    CreateSessionInput,
    ForkInput,
    GenerateInput,
    MoveInput,
    PromptInput,
    SyntheticInput,
    UpdateSessionInput,
    ViewInput,
)
from protocol.shapes import Location

__all__ = ["HANDLERS", "Call", "Handler"]


@attrs.frozen(kw_only=True)
class Call:
    runtime: Runtime
    path: dict[str, str]
    query: Any
    body: Any
    request: web.Request
    #: The request's Location (``directory`` query / ``x-opencode-directory`` header).
    directory: str | None

    @property
    def session_id(self) -> str:
        return self.path["sessionID"]


Handler = Callable[[Call], Awaitable[Any]]


async def session_list(call: Call) -> Any:
    q: SessionListQuery = call.query or SessionListQuery()
    if q.cursor is not None and all(v is None for v in (q.limit, q.order, q.search, q.parent_id)):
        return await call.runtime.sessions.list(cursor=q.cursor)
    query = SessionQuery(
        order=q.order or "desc",
        limit=50 if q.limit is None else q.limit,
        search=q.search or None,
        parent_id=None if q.parent_id in (None, "null") else q.parent_id,
        roots=q.parent_id == "null",
    )
    return await call.runtime.sessions.list(query, cursor=q.cursor)


async def session_create(call: Call) -> Any:
    body: CreateSessionInput = call.body
    if body.location is None and call.directory is not None:
        body = attrs.evolve(body, location=Location(directory=call.directory))
    return await call.runtime.sessions.create(body)


async def session_active(call: Call) -> Any:
    active = await call.runtime.active()
    return {sid: ActiveSession(host=host, epoch=epoch) for sid, (host, epoch) in active.items()}


async def session_get(call: Call) -> Any:
    return await call.runtime.sessions.get(call.session_id)


async def session_update(call: Call) -> Any:
    body: UpdateSessionInput = call.body
    await call.runtime.sessions.update(call.session_id, body)


async def session_remove(call: Call) -> Any:
    await call.runtime.sessions.remove(call.session_id)


async def session_prompt(call: Call) -> Any:
    body: PromptInput = call.body
    return await call.runtime.sessions.prompt(call.session_id, body)


async def session_synthetic(call: Call) -> Any:
    body: SyntheticInput = call.body
    return await call.runtime.sessions.synthetic(call.session_id, body)


async def session_compact(call: Call) -> Any:
    body: CompactInput = call.body
    return await call.runtime.sessions.compact(call.session_id, body.id, body.delivery)


async def session_interrupt(call: Call) -> Any:
    q: InterruptQuery = call.query or InterruptQuery()
    interrupted = await call.runtime.interrupt(call.session_id, resume=q.resume)
    return InterruptResult(interrupted=interrupted)


async def session_resume(call: Call) -> Any:
    await call.runtime.sessions.get(call.session_id)
    terminal = await call.runtime.resume(call.session_id)
    if terminal.kind == "interrupted" and terminal.reason == "shutdown":
        raise ServiceUnavailableError("the server is shutting down", service="execution")


async def session_wait(call: Call) -> Any:
    await call.runtime.sessions.get(call.session_id)
    await call.runtime.wait_idle(call.session_id)


async def session_switch_agent(call: Call) -> Any:
    body: AgentInput = call.body
    await call.runtime.sessions.switch_agent(call.session_id, body.agent)


async def session_agents(call: Call) -> Any:
    session = await call.runtime.sessions.get(call.session_id)
    catalog = await call.runtime.agents.load(session.location.directory)
    return [
        AgentInfo(name=a.name, mode=a.mode, description=a.description, model=a.model)
        for a in (catalog.agents[name] for name in catalog.names())
    ]


async def server_models(call: Call) -> Any:
    return [ModelInfo(provider_id=p, id=m) for p, m in call.runtime.services.providers.listed()]


async def session_switch_model(call: Call) -> Any:
    body: ModelInput = call.body
    await call.runtime.sessions.switch_model(call.session_id, body.model)


async def inbox_list(call: Call) -> Any:
    return await call.runtime.sessions.pending(call.session_id)


async def inbox_cancel(call: Call) -> Any:
    await call.runtime.sessions.cancel(call.session_id, call.path["inboxID"])


async def inbox_update(call: Call) -> Any:
    body: DeliveryInput = call.body
    await call.runtime.sessions.change_delivery(
        call.session_id, call.path["inboxID"], body.delivery
    )


async def permission_list(call: Call) -> Any:
    return await call.runtime.sessions.permissions(call.session_id)


async def permission_reply(call: Call) -> Any:
    body: PermissionReplyInput = call.body
    await call.runtime.sessions.reply_permission(
        call.session_id, call.path["permissionID"], body.reply
    )


async def session_messages(call: Call) -> Any:
    q: MessagesQuery = call.query or MessagesQuery()
    return await call.runtime.sessions.messages(
        call.session_id, order=q.order, limit=q.limit, cursor=q.cursor
    )


async def session_message(call: Call) -> Any:
    return await call.runtime.sessions.message(call.session_id, call.path["messageID"])


async def session_context(call: Call) -> Any:
    return await call.runtime.sessions.context(call.session_id)


async def session_move(call: Call) -> Any:
    body: MoveInput = call.body
    await call.runtime.sessions.move(call.session_id, body.directory, body.delivery)


async def session_children(call: Call) -> Any:
    return await call.runtime.sessions.children(call.session_id)


async def session_fork(call: Call) -> Any:
    body: ForkInput = call.body
    return await call.runtime.sessions.fork(call.session_id, body.before)


async def session_view(call: Call) -> Any:
    body: ViewInput = call.body
    await call.runtime.sessions.view(call.session_id, body.idle)


async def session_generate(call: Call) -> Any:
    body: GenerateInput = call.body
    return GenerateResult(
        text=await call.runtime.services.generator.generate(call.session_id, body.prompt)
    )


async def session_export(call: Call) -> Any:
    q: ExportQuery = call.query or ExportQuery()
    return await call.runtime.transfer.export(call.session_id, sanitize=q.sanitize)


async def session_import(call: Call) -> Any:
    # A large_body operation: the JSON value, decoded and checked by the import.
    return await call.runtime.transfer.import_json(call.body, directory=call.directory)


async def session_stats(call: Call) -> Any:
    return await call.runtime.transfer.stats()


async def session_shell(call: Call) -> Any:
    body: ShellInput = call.body
    session = await call.runtime.sessions.get(call.session_id)
    await call.runtime.shells.start(session, body.command, body.id)


async def session_shell_cancel(call: Call) -> Any:
    await call.runtime.sessions.get(call.session_id)
    await call.runtime.shells.cancel(call.session_id, call.path["shellID"])


async def session_environment(call: Call) -> Any:
    body: EnvironmentInput = call.body
    await call.runtime.sessions.get(call.session_id)
    call.runtime.services.environments.replace(call.session_id, body.variables)


async def revert_stage(call: Call) -> Any:
    body: RevertStageInput = call.body
    return await call.runtime.reverts.stage(call.session_id, body.message_id, body.files)


async def revert_clear(call: Call) -> Any:
    await call.runtime.reverts.clear(call.session_id)


async def revert_commit(call: Call) -> Any:
    await call.runtime.reverts.commit(call.session_id)


async def session_diff(call: Call) -> Any:
    q: DiffQuery = call.query or DiffQuery()
    return await call.runtime.reverts.diff(
        call.session_id,
        q.from_,
        q.to,
        3 if q.context is None else q.context,
        message_id=q.message_id,
    )


async def instruction_entries(call: Call) -> Any:
    return await call.runtime.instructions.list(call.session_id)


async def instruction_entry_put(call: Call) -> Any:
    body: InstructionEntryInput = call.body
    await call.runtime.instructions.put(call.session_id, call.path["key"], body.value)


async def instruction_entry_remove(call: Call) -> Any:
    await call.runtime.instructions.remove(call.session_id, call.path["key"])


async def server_mcp(call: Call) -> Any:
    return [
        McpServerStatus(
            name=entry["name"],
            transport=entry["transport"],
            status=entry["status"],
            error=entry.get("error"),
            tools=tuple(entry["tools"]),
            locations=tuple(McpLocationStatus(**where) for where in entry["locations"]),
        )
        for entry in call.runtime.mcp.status()
    ]


HANDLERS: dict[str, Handler] = {
    "session.list": session_list,
    "session.create": session_create,
    "session.active": session_active,
    "session.get": session_get,
    "session.update": session_update,
    "session.remove": session_remove,
    "session.children": session_children,
    "session.fork": session_fork,
    "session.view": session_view,
    "session.generate": session_generate,
    "session.export": session_export,
    "session.importSession": session_import,
    "session.stats": session_stats,
    "session.prompt": session_prompt,
    "session.compact": session_compact,
    "session.move": session_move,
    "session.synthetic": session_synthetic,
    "session.interrupt": session_interrupt,
    "session.resume": session_resume,
    "session.wait": session_wait,
    "session.agents": session_agents,
    "session.switchAgent": session_switch_agent,
    "session.switchModel": session_switch_model,
    "session.inbox.list": inbox_list,
    "session.inbox.cancel": inbox_cancel,
    "session.inbox.update": inbox_update,
    "session.permission.list": permission_list,
    "session.permission.reply": permission_reply,
    "session.messages": session_messages,
    "session.message.get": session_message,
    "session.context": session_context,
    "session.shell": session_shell,
    "session.shell.cancel": session_shell_cancel,
    "session.environment": session_environment,
    "session.revert.stage": revert_stage,
    "session.revert.clear": revert_clear,
    "session.revert.commit": revert_commit,
    "session.diff": session_diff,
    "session.instructions.entry.list": instruction_entries,
    "session.instructions.entry.put": instruction_entry_put,
    "session.instructions.entry.remove": instruction_entry_remove,
    "server.models": server_models,
    "server.mcp": server_mcp,
}
