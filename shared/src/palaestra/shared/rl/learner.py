"""The learner's face, and the in-process learner (``learner.world_size`` 1) behind it.

A learner scores a batch's rows and updates its policy from one RL step's tensors (`update.StepData`);
the trainer (rl/trainer.py) drives any learner through `Learner` alone, as it drives rollouts through
`LocalRollouts` / `RayRollouts`. `LocalLearner` holds the model in the trainer's own process;
`DistributedLearner` (rl/distributed.py) the N ranks of a sharded one. Both run the one inner loop of
rl/update.py (the ranks with their collectives).

- ``score(batch, with_entropy=, ref=)``: (N, L-1) log-probs (and entropies) under the policy or the frozen
  reference, at `scoring_temperature`;
- ``update(data)``: the RL step's PPO epochs x minibatches (`ppo_update`), the learning rate set
  before every optimizer step (rl/optim.py); ``optimizer_step(data, idx, lr)``: one of them;
- ``set_learning_rate``, ``state_dict`` (the full HF weights), ``save`` / ``load`` (what a checkpoint
  holds beyond the trainer's weights and optimizer: the ranks' shards; nothing in process), ``close``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

import torch

from palaestra.shared.rl.batch import TrainBatch
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.logprobs import token_logprobs_and_entropy
from palaestra.shared.rl.optim import optimizer_steps, set_learning_rate, step_learning_rate
from palaestra.shared.rl.policy import autocast
from palaestra.shared.rl.update import Forward, StepData, minibatch_step, over_minibatches, score_rows


class Learner(Protocol):
    """What the trainer asks of a learner (in process or sharded)."""

    cfg: TrainConfig

    def score(
        self, batch: TrainBatch, *, with_entropy: bool = True, ref: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def optimizer_step(self, data: StepData, idx: torch.Tensor, lr: float | None = None) -> dict[str, float]: ...

    def update(self, data: StepData) -> dict[str, float]: ...

    def set_learning_rate(self, lr: float) -> None: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def save(self, path: str | Path) -> None: ...

    def load(self, path: str | Path) -> None: ...

    def close(self) -> None: ...


def scoring_temperature(cfg: TrainConfig) -> float:
    """The temperature the learner divides logits by (old, new and reference log-probs alike):
    ``loss.logprob_temperature``, or the rollout's sampling temperature when that is None."""
    return cfg.rollout.temperature if cfg.loss.logprob_temperature is None else cfg.loss.logprob_temperature


def model_forward(model: torch.nn.Module, temperature: float, shared_prompt: bool = False) -> Forward:
    """The inner loop's forward over `model` in this process (`logprobs.token_logprobs_and_entropy` on the
    model's own tokens, moved to its device)."""
    device = next(model.parameters()).device

    def forward(rows: TrainBatch, with_entropy: bool):
        return token_logprobs_and_entropy(
            model,
            rows.input_ids.to(device),
            rows.attention_mask.to(device),
            temperature,
            with_entropy=with_entropy,
            positions=rows.loss_mask.to(device) > 0,  # the output head runs on the model's tokens only
            shared_prompt=shared_prompt,
        )

    return forward


def releases_memory(cfg: TrainConfig) -> bool:
    """Whether the learner hands its update's memory back after each update: when its GPU is shared with vLLM
    engines that sleep through the update (the colocated layouts, rl/layout.py), which need it back to wake."""
    return cfg.workers.num_workers > 0 and (cfg.workers.llm or cfg.llm).sleep_mode


def release_memory(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Drop the last update's gradients and return PyTorch's cached GPU blocks to the driver, so that a colocated
    vLLM engine can wake into them: what stays is the weights, AdamW's moments and the reference (plan_layout.py)."""
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def ppo_update(learner: Learner, data: StepData) -> dict[str, float]:
    """``ppo_epochs`` passes over the step's rows in shuffled minibatches (a function of seed and step), one
    optimizer step each at its scheduled rate; the metrics averaged over the optimizer steps."""
    cfg, rows = learner.cfg, len(data.batch)
    per_step = optimizer_steps(cfg, rows)
    return over_minibatches(
        cfg.ppo_epochs,
        cfg.minibatch_size,
        cfg.seed,
        data.step,
        rows,
        lambda idx, k: learner.optimizer_step(data, idx, step_learning_rate(cfg, data.step, data.steps, k, per_step)),
    )


class LocalLearner:
    """The learner in the trainer's own process: its model (float32 master weights), AdamW, the reference."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        compute_dtype: torch.dtype,
        ref_model: torch.nn.Module | None = None,
        adapter: str | None = None,
    ):
        self.cfg, self.model, self.optimizer, self.ref_model = cfg, model, optimizer, ref_model
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        self.adapter = adapter
        """This policy's LoRA adapter on a base model that holds several (rl/policies.py): active for its forwards."""

    def score(
        self, batch: TrainBatch, *, with_entropy: bool = True, ref: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of every row; ``ref``: under the frozen reference (with LoRA, the model
        with its adapters off). Micro-batches of ``learner.micro_batch_tokens``, at most a minibatch of rows."""
        cfg = self.cfg
        model = self.ref_model if ref and self.ref_model is not None else self.model
        adapters_off = ref and self.ref_model is None
        adapters = self.model.disable_adapter() if adapters_off else contextlib.nullcontext()  # type: ignore[operator]
        self._activate()
        self.model.eval()
        with autocast(self.device, self.compute_dtype), adapters:
            forward = model_forward(model, scoring_temperature(cfg), cfg.learner.shared_prompt)
            rows = torch.arange(len(batch))
            max_rows = cfg.minibatch_size or len(batch)
            return score_rows(forward, batch, rows, cfg.learner.micro_batch_tokens, max_rows, with_entropy)

    def optimizer_step(self, data: StepData, idx: torch.Tensor, lr: float | None = None) -> dict[str, float]:
        """One optimizer step over the minibatch rows `idx` (at `lr` when given)."""
        cfg = self.cfg
        if lr is not None:
            self.set_learning_rate(lr)
        self._activate()  # before the params: only the active adapter's require grad
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        with autocast(self.device, self.compute_dtype):
            forward = model_forward(self.model, scoring_temperature(cfg), cfg.learner.shared_prompt)
            tokens, max_norm = cfg.learner.micro_batch_tokens, cfg.optim.max_grad_norm
            return minibatch_step(forward, data, idx, self.optimizer, params, cfg.loss, tokens, max_norm, self.device)

    def update(self, data: StepData) -> dict[str, float]:
        metrics = ppo_update(self, data)
        if releases_memory(self.cfg):
            release_memory(self.optimizer, self.device)
        return metrics

    def _activate(self) -> None:
        if self.adapter is not None:
            self.model.set_adapter(self.adapter)  # type: ignore[operator]

    def set_learning_rate(self, lr: float) -> None:
        set_learning_rate(self.optimizer, lr)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def save(self, path: str | Path) -> None:
        """Nothing beyond the checkpoint's weights and optimizer (rl/checkpoint.py), which are this learner's."""

    def load(self, path: str | Path) -> None:
        """Nothing: `checkpoint.load` restores this learner's model and optimizer in place."""

    def close(self) -> None:
        pass
