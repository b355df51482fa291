"""A :class:`ModelRequest` as an Anthropic Messages streaming request body.

- the agent's system prompt goes in the top-level ``system`` field; system
  messages of the history (the format has no such role) become user text
  where they are;
- the conversation alternates ``user`` and ``assistant``: consecutive
  messages of the same role are merged into one, so tool results (sent as
  ``tool_result`` blocks in the user message after the calls) come first in
  that message, before any user text that follows them;
- an assistant message's reasoning is replayed as a ``thinking`` block only
  to the same provider and model that wrote it, and only with its
  signature (the API rejects unsigned thinking); otherwise it is dropped;
- a hosted (provider-executed) call goes back natively, as its
  ``server_tool_use`` block and the provider's own result block, only to
  the same provider and model and only with its result (the API rejects a
  ``server_tool_use`` without one); otherwise as plain text;
- ``tool_use`` blocks carry the decoded input; tools are sent with their
  JSON Schemas as ``input_schema``; ``max_tokens`` (required by the API)
  comes from the model's ``output`` limit.
"""

from __future__ import annotations

from typing import Any, Final

from actors.llm._request import (
    ChatMessage,
    FileContent,
    HostedContent,
    ModelRequest,
    ReasoningContent,
    TextContent,
    ToolCallContent,
    ToolResultContent,
    bounded_result,
)

__all__ = ["DEFAULT_MAX_TOKENS", "anthropic_body"]

#: ``max_tokens`` for a model the configuration does not list (the API needs one).
DEFAULT_MAX_TOKENS: Final = 4096


def anthropic_body(request: ModelRequest, max_tokens: int | None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        role, blocks = _blocks(message, request)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    body: dict[str, Any] = {
        "model": request.model.id,
        "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
        "messages": messages,
        "stream": True,
    }
    if request.system:
        body["system"] = "\n\n".join(request.system)
    if request.tools:
        body["tools"] = [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": dict(tool.input_schema),
            }
            for tool in request.tools
        ]
        body["tool_choice"] = {"type": request.tool_choice}
    return body


def _blocks(message: ChatMessage, request: ModelRequest) -> tuple[str, list[dict[str, Any]]]:
    blocks: list[dict[str, Any]] = []
    if message.role == "assistant":
        replay = message.model == request.model
        for part in message.parts:
            if isinstance(part, ReasoningContent):
                if replay and part.signature:
                    blocks.append(
                        {"type": "thinking", "thinking": part.text, "signature": part.signature}
                    )
            elif isinstance(part, TextContent) and part.text:
                blocks.append({"type": "text", "text": part.text})
            elif isinstance(part, HostedContent):
                if replay and part.result is not None:
                    blocks.append(
                        {
                            "type": "server_tool_use",
                            "id": part.id,
                            "name": part.name,
                            "input": dict(part.input),
                        }
                    )
                    blocks.append(dict(part.result))
                else:
                    blocks.append({"type": "text", "text": part.text})
            elif isinstance(part, ToolCallContent):
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": part.id,
                        "name": part.name,
                        "input": dict(part.input),
                    }
                )
        return "assistant", blocks
    for part in message.parts:
        if isinstance(part, ToolResultContent):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": part.id,
                "content": bounded_result(part.output),
            }
            if part.is_error:
                result["is_error"] = True
            blocks.append(result)
        elif isinstance(part, TextContent) and part.text:
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, FileContent):
            blocks.append(_file(part))
    return "user", blocks


def _file(part: FileContent) -> dict[str, Any]:
    source = {"type": "base64", "media_type": part.mime, "data": part.data}
    if part.mime.startswith("image/"):
        return {"type": "image", "source": source}
    if part.mime == "application/pdf":
        return {"type": "document", "source": source}
    return {"type": "text", "text": f"[attached file {part.name or ''} ({part.mime}) not sent]"}
