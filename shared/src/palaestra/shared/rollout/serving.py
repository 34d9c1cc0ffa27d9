"""How a rollout worker serves several policies: what the learner sends, and the clients built from it.

The learner (rl/policies.py) describes its policies as one of two typed objects; they travel to Ray
actors and to the in-process background engine (rl/async_rollouts.py):

- `AdapterServing`: LoRA adapters on one base model. Each adapter is a policy; on the transformers
  backend they are peft adapters on the worker's model, on vLLM the engine's multi-LoRA adapters.
- `ModelServing`: one model per policy, each its own ``llm`` (the transformers backend).

Both carry `PolicyRoutes`: which policy plays each agent. `serve` builds the worker's clients; the weights
of a sync are then keyed the same way (adapter or policy name), each part loading into its own client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from palaestra.shared.config import ConfigError
from palaestra.shared.llm.base import LLMClient, LLMConfig, make_client
from palaestra.shared.llm.lora import AdapterClient, LoraConfig, peft_config, with_lora


@dataclass(frozen=True)
class PolicyRoutes:
    """Which policy plays each agent, by key (its adapter on one base, else its name)."""

    agents: dict[str, str]
    default: str | None = None
    """The key of the policy that plays every agent not named (None: there is none)."""

    def route(self, clients: dict[str, Any]) -> Callable[[str], Any]:
        """Each agent to its policy's client in `clients` (by key)."""

        def route(agent: str) -> Any:
            key = self.agents.get(agent, self.default)
            if key is None:
                raise ConfigError(f"agent {agent!r} has no policy (policies' agents: {self.agents}); add it to one")
            return clients[key]

        return route


@dataclass(frozen=True)
class AdapterServing:
    """LoRA policies on one base: the adapters' settings, their names (the weights' keys) and the routes."""

    lora: LoraConfig
    adapters: tuple[str, ...]
    routes: PolicyRoutes

    nested = True
    """A sync's part for one adapter is ``{adapter: tensors}`` (what an adapter client loads)."""


@dataclass(frozen=True)
class ModelServing:
    """Policies with a model each: each policy's llm by name (the weights' keys) and the routes."""

    models: dict[str, LLMConfig]
    routes: PolicyRoutes

    nested = False
    """A sync's part for one policy is that model's state dict."""

    def with_llm(self, fn: Callable[[LLMConfig], LLMConfig]) -> ModelServing:
        """The same policies with `fn` of each one's llm (e.g. float32 for the background engine)."""
        return dataclasses.replace(self, models={name: fn(llm) for name, llm in self.models.items()})


Serving = AdapterServing | ModelServing


def serve(llm: LLMConfig, serving: Serving) -> tuple[LLMClient, dict[str, Any], Callable[[str], Any]]:
    """A worker's clients for `serving`: the base (or first model's) client, each policy's client by key, and
    the route of each agent to its policy's."""
    if isinstance(serving, ModelServing):
        clients: dict[str, Any] = {name: make_client(model) for name, model in serving.models.items()}
        return next(iter(clients.values())), clients, serving.routes.route(clients)
    base = adapter_engine(llm, serving)
    clients = serve_adapters(base, serving)
    return base, clients, serving.routes.route(clients)


def adapter_engine(llm: LLMConfig, serving: AdapterServing) -> LLMClient:
    """The base model's client to serve the adapters on: a vLLM engine started with multi-LoRA serving
    (llm/vllm_backend.py); a transformers model gets them from `serve_adapters`."""
    if llm.backend == "vllm":
        from palaestra.shared.llm.vllm_backend import VLLMClient

        return VLLMClient(llm, lora=dataclasses.asdict(serving.lora), max_loras=len(serving.adapters))
    return make_client(llm)


def serve_adapters(client: LLMClient, serving: AdapterServing) -> dict[str, Any]:
    """Each adapter's client on `client`, by adapter: peft adapters on its model, or a vLLM engine's own LoRA
    adapters (each client's `load_weights` takes adapters' weights by adapter)."""
    names = serving.adapters
    if hasattr(client, "adapter_client"):  # vLLM: the engine holds them (`VLLMClient.load_adapters`)
        return {name: client.adapter_client(name) for name in names}
    model: Any = with_lora(client.model, serving.lora, names[0])
    for name in names[1:]:
        model.add_adapter(name, peft_config(serving.lora))
    return {name: AdapterClient(client, model, name) for name in names}
