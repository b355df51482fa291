"""One-off generation: an answer from a session's context and model, recorded nowhere.

``session.generate`` builds the request a step would (the session's agent,
model and projected history, no tools), adds the prompt as a last user
message and collects the streamed text. Nothing is appended to the log: the
session, its transcript and its inbox are exactly as they were.
"""

from __future__ import annotations

import contextlib
from typing import Final

from actors.agents import AgentCatalogs
from actors.llm import (
    ChatMessage,
    ModelRequest,
    ProviderError,
    ProviderRegistry,
    TextChunk,
    TextContent,
)
from actors.session.history import ChatCache, to_chat
from actors.sessions import Sessions
from protocol.errors import InvalidRequestError, ServiceUnavailableError
from protocol.shapes import ModelRef
from storage import Store

__all__ = ["MAX_GENERATED_CHARS", "Generator"]

#: The most text one generation returns; the stream is closed once it is reached.
MAX_GENERATED_CHARS: Final = 1_000_000


class Generator:
    def __init__(
        self,
        *,
        store: Store,
        sessions: Sessions,
        providers: ProviderRegistry,
        agents: AgentCatalogs,
        chat: ChatCache,
        default_model: ModelRef,
    ) -> None:
        self._store = store
        self._sessions = sessions
        self._providers = providers
        self._agents = agents
        self._chat = chat
        self._default_model = default_model

    async def generate(self, session_id: str, prompt: str) -> str:
        if not prompt.strip():
            raise InvalidRequestError("prompt must not be empty", field="prompt")
        session = await self._sessions.get(session_id)
        agent = await self._agents.agent(session.location.directory, session.agent)
        history = await self._store.queries.context(session_id)
        messages = (
            *to_chat(history, self._chat, native=False),
            ChatMessage(role="user", parts=(TextContent(text=prompt),)),
        )
        request = ModelRequest(
            session_id=session.id,
            agent=agent.name,
            model=session.model or agent.model or self._default_model,
            system=(agent.system,) if agent.system else (),
            messages=messages,
            tools=(),
            metadata={"generate": True},
        )
        chunks: list[str] = []
        size = 0
        try:
            provider = self._providers.resolve(request.model)
            async with contextlib.aclosing(provider.stream(request)) as stream:
                async for part in stream:
                    if isinstance(part, TextChunk):
                        chunks.append(part.delta)
                        size += len(part.delta)
                        if size >= MAX_GENERATED_CHARS:
                            break
        except ProviderError as exc:
            raise ServiceUnavailableError(
                f"the model could not answer: {exc}", service="provider"
            ) from None
        return "".join(chunks)[:MAX_GENERATED_CHARS]
