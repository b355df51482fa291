"""Models: the provider seam, its normalized stream, and the built-in scripted model.

- The request the drain sends (``_request``): :class:`ModelRequest` with its
  history of :class:`ChatMessage` values and the :class:`ToolSpec` list.
- The stream a provider yields (``_stream``): text, reasoning and tool-input
  parts, :class:`ToolCall`, and one closing :class:`Finish` with :class:`Usage`.
- Typed failures and their retry classification (``_errors``):
  :class:`ProviderError` and its subclasses, :func:`is_retryable`.
- :class:`Provider`, the protocol adapters implement (``_provider``), and
  :class:`ProviderRegistry`, which picks one for a model (``_registry``).
- :class:`ScriptedProvider` (``scripted``, script language in ``_script``):
  deterministic answers with no key and no network, the embedded default.
- Real models over HTTP: the OpenAI-compatible (``openai``) and Anthropic
  (``anthropic``) adapters, their configuration (``_config``:
  :class:`ProviderConfig`), and :func:`build_providers` (``adapters``).
- The step allowance directive (``max_steps``) and :class:`RetryPolicy`
  (``retry``).
"""

from actors.llm._config import (
    ModelLimits,
    ProviderConfig,
    ProviderKind,
    parse_model_ref,
    parse_providers,
)
from actors.llm._errors import (
    AuthenticationError,
    ContentPolicyError,
    ContextOverflowError,
    ContinuationRejectedError,
    IncompleteStreamError,
    NoRouteError,
    ProviderError,
    ProviderInternalError,
    ProviderInvalidRequestError,
    QuotaExceededError,
    RateLimitError,
    SendState,
    TransportError,
    UnsupportedOperationError,
    is_retryable,
)
from actors.llm._provider import Provider
from actors.llm._registry import SCRIPTED_MODEL, SCRIPTED_PROVIDER_ID, ProviderRegistry
from actors.llm._request import (
    ChatMessage,
    ContentPart,
    FileContent,
    HostedContent,
    ModelRequest,
    ReasoningContent,
    Role,
    TextContent,
    ToolCallContent,
    ToolChoice,
    ToolResultContent,
    ToolSpec,
)
from actors.llm._script import ScriptError, parse_script
from actors.llm._stream import (
    FINISH_REASONS,
    Finish,
    FinishReason,
    HostedResult,
    ReasoningChunk,
    ReasoningEnd,
    ReasoningStart,
    StreamPart,
    TextChunk,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputChunk,
    ToolInputEnd,
    ToolInputStart,
    Usage,
)
from actors.llm.adapters import HttpProvider, build_providers
from actors.llm.anthropic import AnthropicProvider
from actors.llm.max_steps import (
    MAX_STEPS_MESSAGE,
    MAX_STEPS_TEXT,
    TOOLS_DISABLED_ERROR,
    is_max_steps_message,
    with_max_steps,
)
from actors.llm.openai import OpenAIProvider
from actors.llm.retry import RetryPolicy
from actors.llm.scripted import ScriptedProvider

__all__ = [
    "FINISH_REASONS",
    "MAX_STEPS_MESSAGE",
    "MAX_STEPS_TEXT",
    "SCRIPTED_MODEL",
    "SCRIPTED_PROVIDER_ID",
    "TOOLS_DISABLED_ERROR",
    "AnthropicProvider",
    "AuthenticationError",
    "ChatMessage",
    "ContentPart",
    "ContentPolicyError",
    "ContextOverflowError",
    "ContinuationRejectedError",
    "FileContent",
    "Finish",
    "FinishReason",
    "HostedContent",
    "HostedResult",
    "HttpProvider",
    "IncompleteStreamError",
    "ModelLimits",
    "ModelRequest",
    "NoRouteError",
    "OpenAIProvider",
    "Provider",
    "ProviderConfig",
    "ProviderError",
    "ProviderInternalError",
    "ProviderInvalidRequestError",
    "ProviderKind",
    "ProviderRegistry",
    "QuotaExceededError",
    "RateLimitError",
    "ReasoningChunk",
    "ReasoningContent",
    "ReasoningEnd",
    "ReasoningStart",
    "RetryPolicy",
    "Role",
    "ScriptError",
    "ScriptedProvider",
    "SendState",
    "StreamPart",
    "TextChunk",
    "TextContent",
    "TextEnd",
    "TextStart",
    "ToolCall",
    "ToolCallContent",
    "ToolChoice",
    "ToolInputChunk",
    "ToolInputEnd",
    "ToolInputStart",
    "ToolResultContent",
    "ToolSpec",
    "TransportError",
    "UnsupportedOperationError",
    "Usage",
    "build_providers",
    "is_max_steps_message",
    "is_retryable",
    "parse_model_ref",
    "parse_providers",
    "parse_script",
    "with_max_steps",
]
