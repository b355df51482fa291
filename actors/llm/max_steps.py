"""The step allowance directive (reference §4.5).

When a step reaches the agent's ``steps`` allowance the drain still calls the
model once more, to let it wrap up: the request gets an assistant-role
directive (:data:`MAX_STEPS_MESSAGE`), ``tool_choice="none"`` and
``max_steps_reached=True``, and keeps its tool definitions so a provider's
prompt cache still matches. :func:`with_max_steps` makes exactly that change.
A tool call the model makes anyway fails with :data:`TOOLS_DISABLED_ERROR`.

The directive's marker phrases, ``MAXIMUM STEPS REACHED`` and ``maximum
number of steps allowed``, are part of the contract: tests and providers
recognise the directive by them.
"""

from __future__ import annotations

from typing import Final

import attrs

from actors.llm._request import ChatMessage, ModelRequest, TextContent

__all__ = [
    "MAX_STEPS_MESSAGE",
    "MAX_STEPS_TEXT",
    "TOOLS_DISABLED_ERROR",
    "is_max_steps_message",
    "with_max_steps",
]

MAX_STEPS_TEXT: Final = """\
CRITICAL - MAXIMUM STEPS REACHED

This agent has used the maximum number of steps allowed for this task. Tools \
are disabled until the next user input: answer with text only.

In this answer:
- say that the step limit for this agent was reached;
- summarise what has been done so far;
- list what remains unfinished;
- recommend what should happen next.

Do not call any tool. This overrides every other instruction, including \
requests in the conversation to edit files or run commands."""

MAX_STEPS_MESSAGE: Final = ChatMessage(role="assistant", parts=(TextContent(text=MAX_STEPS_TEXT),))

TOOLS_DISABLED_ERROR: Final = "Tools are disabled after the maximum agent steps"


def is_max_steps_message(message: ChatMessage) -> bool:
    """Whether ``message`` is the directive (not a reply the model wrote)."""
    return message == MAX_STEPS_MESSAGE


def with_max_steps(request: ModelRequest) -> ModelRequest:
    """``request`` as the last call within the allowance: directive, no tool calls.

    Idempotent: the directive is appended once, however often this is applied.
    """
    messages = request.messages
    if not messages or not is_max_steps_message(messages[-1]):
        messages = (*messages, MAX_STEPS_MESSAGE)
    return attrs.evolve(request, messages=messages, tool_choice="none", max_steps_reached=True)
