"""LoRA adapters on a client's model: their settings, peft's wrapping, and a client with one adapter active.

The learner (rl/policy.py) and the rollout workers (rollout/serving.py) both put adapters on a model.
Several policies as adapters on one base each sample through an `AdapterClient`: the base client with
that policy's adapter switched on before every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from palaestra.shared.llm.base import LLMClient

if TYPE_CHECKING:  # annotations only: `LoraConfig` loads without torch (`palaestra show`)
    import torch


@dataclass
class LoraConfig:
    """LoRA adapter settings (peft's ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``)."""

    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def peft_config(cfg: LoraConfig):
    """peft's config of an adapter with `cfg`'s settings."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules)
    )


def with_lora(model, cfg: LoraConfig, adapter: str = "default"):
    """`model` wrapped with one LoRA adapter named `adapter`."""
    from peft import get_peft_model

    # wraps in place: the rollout client's model sees the adapters
    return get_peft_model(model, peft_config(cfg), adapter_name=adapter)


class AdapterClient:
    """The base model's client generating with one adapter active.

    Everything else is the base client's: tokenizer, chat template. Its ``model`` runs the base with this
    adapter active too, so a scorer reading a policy off the model (e.g. mars's exploitability) can call it.
    """

    def __init__(self, client: LLMClient, model: Any, adapter: str):
        self.client, self.peft, self.adapter = client, model, adapter
        self.model = AdapterModel(model, adapter)

    def generate(self, prompts, params):
        self.peft.set_adapter(self.adapter)
        return self.client.generate(prompts, params)

    def load_weights(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Adapters' weights by adapter, into this base model's adapters."""
        from peft import set_peft_model_state_dict

        for adapter, tensors in state.items():
            set_peft_model_state_dict(self.peft, tensors, adapter_name=adapter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class AdapterModel:
    """A peft model called with one adapter active (its other attributes are the model's)."""

    def __init__(self, model: Any, adapter: str):
        self.peft, self.adapter = model, adapter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.peft.set_adapter(self.adapter)
        return self.peft(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.peft, name)
