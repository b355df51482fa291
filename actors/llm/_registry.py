"""Which provider serves a model: :class:`ProviderRegistry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from actors.llm._errors import NoRouteError
from actors.llm._provider import Provider
from actors.llm.scripted import ScriptedProvider
from protocol.shapes import ModelRef

__all__ = ["SCRIPTED_MODEL", "SCRIPTED_PROVIDER_ID", "ProviderRegistry"]

SCRIPTED_PROVIDER_ID: Final = "scripted"
#: The model a session without a configured model runs on.
SCRIPTED_MODEL: Final = ModelRef(id="scripted", provider_id=SCRIPTED_PROVIDER_ID)


def _frozen_mapping(value: Mapping[str, Provider]) -> Mapping[str, Provider]:
    return dict(value)


@attrs.frozen(kw_only=True)
class ProviderRegistry:
    """Resolves a :class:`~protocol.shapes.ModelRef` to the provider that serves it.

    - no model (``None``): ``default``, which is ``scripted`` unless given, so
      a runtime with no keys and no network still runs;
    - a ``provider_id`` in ``providers``: that provider;
    - ``provider_id == "scripted"`` (and not overridden in ``providers``):
      ``scripted``, a :class:`~actors.llm.ScriptedProvider` unless given;
    - anything else: :class:`~actors.llm.NoRouteError`. A model that names a
      provider nobody configured is a mistake worth reporting, not a reason
      to answer with scripted text.
    """

    providers: Mapping[str, Provider] = attrs.field(factory=dict, converter=_frozen_mapping)
    scripted: Provider = attrs.field(factory=ScriptedProvider)
    default: Provider = attrs.field(
        default=attrs.Factory(lambda self: self.scripted, takes_self=True)
    )

    def resolve(self, model: ModelRef | None) -> Provider:
        """The provider for ``model``; raises :class:`~actors.llm.NoRouteError`."""
        if model is None:
            return self.default
        provider = self.providers.get(model.provider_id)
        if provider is not None:
            return provider
        if model.provider_id == SCRIPTED_PROVIDER_ID:
            return self.scripted
        raise NoRouteError(
            f"No provider is configured for {model.provider_id!r} (model {model.id!r})"
        )
