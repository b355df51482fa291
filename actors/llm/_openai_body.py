"""A :class:`ModelRequest` as an OpenAI Chat Completions streaming request body.

- the agent's system prompt first, as one ``system`` message; system
  messages of the history stay ``system`` messages where they are;
- user text as a string, or content parts when files are attached (images
  as ``image_url`` data URLs, other files as ``file`` parts);
- an assistant message's text as ``content`` and its calls as ``tool_calls``
  (arguments as JSON text); its reasoning is not sent back: Chat Completions
  has no field that takes it;
- each tool result as its own ``role: tool`` message right after the
  assistant message that made the call, as the format requires;
- tools as ``function`` tools with their JSON Schemas; ``tool_choice: none``
  when the step may not call tools; ``max_tokens`` from the model's ``output``.
"""

from __future__ import annotations

from typing import Any

import orjson

from actors.llm._request import (
    ChatMessage,
    FileContent,
    HostedContent,
    ModelRequest,
    TextContent,
    ToolCallContent,
    ToolResultContent,
    bounded_result,
)

__all__ = ["openai_body"]


def openai_body(request: ModelRequest, max_tokens: int | None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": "\n\n".join(request.system)})
    for message in request.messages:
        messages.extend(_message(message))
    body: dict[str, Any] = {
        "model": request.model.id,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": dict(tool.input_schema),
                },
            }
            for tool in request.tools
        ]
        body["tool_choice"] = request.tool_choice
    return body


def _message(message: ChatMessage) -> list[dict[str, Any]]:
    match message.role:
        case "system":
            return [{"role": "system", "content": message.text}]
        case "user":
            return [{"role": "user", "content": _user_content(message)}]
        case "assistant":
            # Chat completions has no hosted items: a hosted call is plain text.
            texts = [p.text for p in message.parts if isinstance(p, TextContent | HostedContent)]
            out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
            calls = [
                {
                    "id": part.id,
                    "type": "function",
                    "function": {"name": part.name, "arguments": orjson.dumps(part.input).decode()},
                }
                for part in message.parts
                if isinstance(part, ToolCallContent)
            ]
            if calls:
                out["tool_calls"] = calls
            if out["content"] is None and not calls:
                return []  # reasoning only: nothing this format can carry
            return [out]
        case "tool":
            return [
                {
                    "role": "tool",
                    "tool_call_id": part.id,
                    "content": _result_text(part),
                }
                for part in message.parts
                if isinstance(part, ToolResultContent)
            ]
    raise AssertionError(message.role)  # pragma: no cover - roles are validated


def _result_text(part: ToolResultContent) -> str:
    text = bounded_result(part.output)
    return f"Error: {text}" if part.is_error else text


def _user_content(message: ChatMessage) -> str | list[dict[str, Any]]:
    if all(isinstance(p, TextContent) for p in message.parts):
        return message.text
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextContent):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, FileContent):
            url = f"data:{part.mime};base64,{part.data}"
            if part.mime.startswith("image/"):
                content.append({"type": "image_url", "image_url": {"url": url}})
            else:
                content.append(
                    {"type": "file", "file": {"filename": part.name or "file", "file_data": url}}
                )
    return content
