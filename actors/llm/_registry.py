"""Which provider serves a model: :class:`ProviderRegistry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from actors.llm._errors import NoRouteError
from actors.llm._provider import Provider
from actors.llm.scripted import ScriptedProvider
from protocol.errors import InvalidRequestError
from protocol.shapes import ModelRef

__all__ = ["SCRIPTED_MODEL", "SCRIPTED_PROVIDER_ID", "ProviderRegistry"]

SCRIPTED_PROVIDER_ID: Final = "scripted"
#: The model a session without a configured model runs on.
SCRIPTED_MODEL: Final = ModelRef(id="scripted", provider_id=SCRIPTED_PROVIDER_ID)


def _frozen_mapping(value: Mapping[str, Provider]) -> Mapping[str, Provider]:
    return dict(value)


def _frozen_catalog(value: Mapping[str, frozenset[str]]) -> Mapping[str, frozenset[str]]:
    return {provider: frozenset(models) for provider, models in value.items()}


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
    #: The models each configured provider serves; a provider absent here
    #: (one handed in as an object, the scripted one) takes any model id.
    models: Mapping[str, frozenset[str]] = attrs.field(factory=dict, converter=_frozen_catalog)
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

    def listed(self) -> list[tuple[str, str]]:
        """(provider id, model id) of every model a catalog names, and the scripted one, sorted.

        A provider with no catalog (handed in as an object) takes any model id:
        it has nothing to list.
        """
        named = {(p, m) for p, models in self.models.items() for m in models}
        if SCRIPTED_PROVIDER_ID not in self.providers:
            named.add((SCRIPTED_PROVIDER_ID, SCRIPTED_MODEL.id))
        return sorted(named)

    def check(self, model: ModelRef) -> None:
        """Refuse, as a 400 on ``model``, a model no provider here serves.

        Called when a session's model is chosen, so a typo fails that call
        rather than a step later on.
        """
        if not model.id or not model.provider_id:
            raise InvalidRequestError(
                "a model names its id and providerID (neither empty)", kind="model", field="model"
            )
        if model.provider_id not in self.providers and model.provider_id != SCRIPTED_PROVIDER_ID:
            raise InvalidRequestError(
                f"unknown provider {model.provider_id!r}", kind="model", field="model"
            )
        served = self.models.get(model.provider_id)
        if served is not None and model.id not in served:
            raise InvalidRequestError(
                f"provider {model.provider_id!r} has no model {model.id!r}",
                kind="model",
                field="model",
            )
