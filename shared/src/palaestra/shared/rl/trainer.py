"""The policy-gradient trainer shared by egpo and mars (and any package that plugs in).

How a package plugs in
----------------------
Everything is chosen by registry name in a `TrainConfig`, so a package adds
parts and writes a YAML config; it does not subclass the trainer::

    # 1. an environment (multi-turn, multi-agent: any TextEnv) ...
    from palaestra.shared.rollout.env import ENVS, TextEnv, Step
    @ENVS.register("tic_tac_toe")
    class TicTacToe(TextEnv): ...            # reset / current_agent / observe / step / tools

    # ... or, for single-turn tasks, a task source + a reward (the built-in `task` env plays them)
    from palaestra.shared.rollout.tasks import TASKS
    from palaestra.shared.rewards import REWARDS
    @TASKS.register("bfcl_tasks")
    def bfcl_tasks(path: str) -> list[dict]: ...   # [{"messages": [...], "tools": [...], "ground_truth": ...}]
    @REWARDS.register("fc_binary")
    def fc_binary(sample, completion, **info) -> float: ...

    # 2. (optional) an advantage step
    from palaestra.shared.rl.advantages import ADVANTAGES
    @ADVANTAGES.register("my_norm")
    def my_norm(values, batch, *, eps: float = 1e-6): ...   # per-trajectory arrays, one value per turn

    # 3. make the module importable by name: entry points `palaestra.envs`, `palaestra.tasks`,
    #    `palaestra.rewards`, `palaestra.advantages` in the package's pyproject.toml (module path as value)

Then a config (``job: rl.train``, or the package's own job that builds a
`TrainConfig` and calls ``Trainer(cfg, tracker).train()``)::

    job: rl.train
    llm: {model: tiny}                        # or Qwen/Qwen3-4B-Instruct-2507 with backend vllm on GPUs
    envs:                                     # a mixture: each task draws an env by weight
      - {name: task, weight: 1.0, kwargs: {source: bfcl_tasks, reward: fc_binary, source_kwargs: {path: ...}}}
    rollout: {group_size: 8, max_tokens_per_turn: 512, temperature: 0.7}
    advantages:                               # EGPO; MARS: [{name: turn_level}, {name: agent_norm}]
      - {name: grpo}
      - {name: entropy_clipped, options: {lam: 0.4, alpha: 2.0}}
    loss: {epsilon: 0.2, dual_clip: 3.0, kl_coef: 0.001, reduction: grpo}
    tasks_per_step: 16
    workers: {num_workers: 2}                 # 0: rollouts in the learner's process

Self-play (MARS) needs nothing special: a multi-agent env yields one
trajectory per seat, all from the one shared policy, and ``agent_norm``
normalizes per (seat, env type). ``sft_warmup`` runs an SFT stage (rl/sft.py)
on the same model before RL.

The loop (`Trainer.train_step`), top to bottom: draw tasks -> rollout (batched
across envs, locally or on Ray workers) -> old log-probs and entropies ->
reference log-probs (when ``loss.kl_coef`` > 0) -> advantage pipeline ->
``ppo_epochs`` x minibatches of PPO-clip updates -> weight sync to workers ->
MLflow metrics -> checkpoint. A non-finite loss stops the run with a clear
message; the last good checkpoint stays. ``resume: true`` continues from the
newest checkpoint in ``output_dir`` exactly where it stopped. ``eval_tasks``
plays fixed tasks before and after training (``eval/reward_mean`` with a 95% CI).

Metrics (MLflow, per step): train/reward_mean, train/advantage_mean,
train/advantage_std, train/entropy, train/kl, train/clip_fraction, train/loss,
train/grad_norm, perf/tokens_per_s (generated tokens per rollout second),
perf/step_s, perf/rollout_s, rollout/failed, rollout/truncated,
rollout/trajectories, rollout/response_tokens_mean.

Small models on CPU: the RL learning rate wants to be far below the SFT one
(Adam moves every weight by about lr per step); see experiments/shared/toy_rl.yaml.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from palaestra.shared.llm.base import make_client
from palaestra.shared.llm.hf_backend import resolve_device
from palaestra.shared.rl import checkpoint
from palaestra.shared.rl.advantages import AdvantageInput, check_pipeline, compute_advantages
from palaestra.shared.rl.batch import build_batch, score_batch, think_entropy, token_advantages
from palaestra.shared.rl.config import (  # re-exported: packages import the configs from here
    EnvSpec,
    LoraConfig,
    OptimConfig,
    TrainConfig,
    WorkersConfig,
    learner_dtypes,
)
from palaestra.shared.rl.sft import run_sft
from palaestra.shared.rl.update import accumulate_gradients
from palaestra.shared.rollout.engine import EpisodeSpec
from palaestra.shared.rollout.env import ENVS, TextEnv
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts
from palaestra.shared.tracking import Tracker

__all__ = [
    "EnvSpec",
    "LoraConfig",
    "OptimConfig",
    "TrainConfig",
    "Trainer",
    "TrainingError",
    "WorkersConfig",
    "make_env",
]


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the message says where the last good checkpoint is."""


def make_env(name: str, kwargs: dict[str, Any]) -> TextEnv:
    """Build a registered env (module-level, so it pickles to Ray workers)."""
    return ENVS.get(name)(**kwargs)


class Trainer:
    def __init__(self, cfg: TrainConfig, tracker: Tracker | None = None):
        check_pipeline(cfg.advantages)
        if cfg.llm.backend != "transformers":
            raise ValueError(
                f"the learner needs llm.backend=transformers (got {cfg.llm.backend!r}); put vllm under workers.llm"
            )
        self.cfg, self.tracker = cfg, tracker or Tracker(cfg.tracking)
        learner_dtypes(cfg.learner, cfg.llm, resolve_device(cfg.llm.device).type)  # fail before loading
        # float32 master weights; bfloat16 compute (GPU) under autocast
        self.client = make_client(dataclasses.replace(cfg.llm, dtype="float32"))
        self.tokenizer = self.client.tokenizer
        self.model = self.client.model
        self.device = next(self.model.parameters()).device
        self.compute_dtype = getattr(torch, learner_dtypes(cfg.learner, cfg.llm, self.device.type))
        if cfg.learner.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora.enabled:
            self.model = _with_lora(self.model, cfg.lora)
        self.ckpt_dir = Path(cfg.output_dir) / "checkpoints"
        self.step = 0
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.optim.lr,
            weight_decay=cfg.optim.weight_decay,
        )
        resumed = cfg.resume and checkpoint.latest(self.ckpt_dir) is not None
        if resumed:
            self.step = checkpoint.load(checkpoint.latest(self.ckpt_dir), self.model, self.optimizer)
        elif cfg.sft_warmup.steps > 0:
            metrics = run_sft(self.model, self.tokenizer, cfg.sft_warmup, progress=True)
            self.tracker.log_metrics({f"sft/{k}": v for k, v in metrics.items()}, step=0)
        self.ref_model = None
        if cfg.loss.kl_coef and not cfg.lora.enabled:  # with LoRA the reference is the model with adapters off
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
            if resumed:
                checkpoint.load_reference(self.ckpt_dir, self.ref_model)
            else:
                checkpoint.save_reference(self.ckpt_dir, self.ref_model)
        self.think_ids = _think_token_ids(self.tokenizer)
        if cfg.loss.reduction == "dr_grpo" and not cfg.loss.max_len:
            cfg.loss.max_len = cfg.rollout.max_tokens_per_turn
        if cfg.workers.num_workers > 0:
            self.rollouts = RayRollouts(
                cfg.workers.llm or cfg.llm,
                cfg.rollout,
                cfg.workers.num_workers,
                cfg.cluster,
                cfg.workers.num_cpus,
                cfg.workers.num_gpus,
            )
            self.rollouts.sync(self.policy_state())
        else:
            self.rollouts = LocalRollouts(self.client, cfg.rollout)

    # -- the loop ---------------------------------------------------------
    def train(self) -> dict[str, float]:
        history: list[dict[str, float]] = []
        summary: dict[str, float] = {}
        try:
            if self.cfg.eval_tasks:
                summary.update({f"eval_before_{k}": v for k, v in self.evaluate().items()})
            with tqdm(total=self.cfg.steps, initial=self.step, desc="rl steps") as bar:
                while self.step < self.cfg.steps:
                    metrics = self.train_step()
                    history.append(metrics)
                    bar.update(1)
                    bar.set_postfix(reward=f"{metrics['train/reward_mean']:.3f}")
                    if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                        self.save()
            if not self.cfg.checkpoint_every or self.step % self.cfg.checkpoint_every:
                self.save()
            if self.cfg.eval_tasks:
                summary.update({f"eval_after_{k}": v for k, v in self.evaluate().items()})
        finally:
            self.rollouts.close()
        first, last = history[:1], history[-1:]
        return {
            **summary,
            "steps": self.step,
            "reward_first": first[0]["train/reward_mean"] if first else math.nan,
            "reward_last": last[0]["train/reward_mean"] if last else math.nan,
        }

    def train_step(self) -> dict[str, float]:
        cfg, t0 = self.cfg, time.perf_counter()
        # 1. rollout
        self.model.eval()
        result = self.rollouts.run(self.draw_tasks(self.step), seed=cfg.seed * 100_003 + self.step)
        trajs = [t for t in result.trajectories if not t.failed and t.num_response_tokens > 0]
        if not trajs:
            raise TrainingError(f"step {self.step}: no usable trajectories ({result.stats})")
        t_rollout = time.perf_counter() - t0
        # 2. old log-probs and entropies (3. reference log-probs)
        batch = build_batch(trajs, self.tokenizer.pad_token_id, self.think_ids)
        mb = cfg.minibatch_size or len(batch)
        with self._autocast():
            old_logps, entropy = score_batch(
                self.model, batch, cfg.rollout.temperature, cfg.learner.micro_batch_tokens, max_rows=mb
            )
            ref_logps = self._reference_logps(batch, mb) if cfg.loss.kl_coef else None
        # 4. advantages
        adv_in = AdvantageInput.from_trajectories(
            trajs, think_entropy(entropy, batch, "think"), think_entropy(entropy, batch, "response")
        )
        values = compute_advantages(cfg.advantages, adv_in)
        advantages = token_advantages(values, batch.turn_index)
        # 5. PPO epochs over minibatches
        self.model.train()
        with self._autocast():
            updates = self._update(batch, old_logps, ref_logps, advantages, entropy, mb)
        self.model.eval()
        self.step += 1
        # 6. weight sync
        self.rollouts.sync(self.policy_state() if cfg.workers.num_workers else None)
        # 7. metrics
        step_s = time.perf_counter() - t0
        flat_adv = np.concatenate(values)
        metrics = {
            "train/reward_mean": float(np.mean([t.total_reward for t in trajs])),
            "train/advantage_mean": float(flat_adv.mean()),
            "train/advantage_std": float(flat_adv.std()),
            **{f"train/{k}": v for k, v in updates.items()},
            "perf/tokens_per_s": result.stats["generated_tokens"] / max(t_rollout, 1e-9),
            "perf/step_s": step_s,
            "perf/rollout_s": t_rollout,
            "rollout/failed": result.stats["failed"],
            "rollout/truncated": result.stats["truncated"],
            "rollout/trajectories": len(trajs),
            "rollout/response_tokens_mean": float(np.mean([t.num_response_tokens for t in trajs])),
        }
        self.tracker.log_metrics(metrics, step=self.step)
        if cfg.log_samples:
            lines = [f"[{t.agent}] r={t.total_reward:+.3f} {t.turns[-1].text!r}" for t in trajs[: cfg.log_samples]]
            self.tracker.log_text("\n".join(lines), f"samples/step_{self.step:06d}.txt")
        return metrics

    def _update(self, batch, old_logps, ref_logps, advantages, entropy, mb: int) -> dict[str, float]:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + self.step)
        sums: dict[str, float] = {}
        count = 0
        for epoch in range(cfg.ppo_epochs):
            order = torch.randperm(len(batch), generator=gen) if mb < len(batch) else torch.arange(len(batch))
            for start in range(0, len(batch), mb):
                idx = order[start : start + mb]
                self.optimizer.zero_grad(set_to_none=True)
                m = accumulate_gradients(
                    self.model,
                    batch,
                    idx,
                    advantages,
                    cfg.loss,
                    cfg.rollout.temperature,
                    cfg.learner.micro_batch_tokens,
                    old_logps=old_logps,
                    ref_logps=ref_logps,
                    entropies=entropy,
                )
                if not math.isfinite(m["loss"]):
                    last = checkpoint.latest(self.ckpt_dir)
                    raise TrainingError(
                        f"non-finite loss ({m['loss']}) at step {self.step + 1}, epoch {epoch}, minibatch "
                        f"{start // mb}; stopping. Last good checkpoint: {last or 'none (no checkpoint saved yet)'}"
                    )
                m.pop("tokens")
                if cfg.optim.max_grad_norm:
                    m["grad_norm"] = float(
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.max_grad_norm)
                    )
                self.optimizer.step()
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        return {k: v / count for k, v in sums.items()}

    def evaluate(self) -> dict[str, float]:
        """Mean reward per trajectory over fixed tasks, with a 95% confidence interval (normal approximation)."""
        self.model.eval()
        specs = [
            EpisodeSpec(functools.partial(make_env, env.name, dict(env.kwargs)), i, f"eval-{i}")
            for i in range(self.cfg.eval_tasks)
            for env in [self.cfg.envs[i % len(self.cfg.envs)]]
        ]
        result = self.rollouts.run(specs, seed=self.cfg.seed * 100_003 - 1)
        rewards = np.array([t.total_reward for t in result.trajectories if not t.failed])
        mean = float(rewards.mean()) if len(rewards) else math.nan
        ci = float(1.96 * rewards.std(ddof=1) / math.sqrt(len(rewards))) if len(rewards) > 1 else math.nan
        metrics = {"reward_mean": mean, "reward_ci95": ci, "trajectories": len(rewards)}
        self.tracker.log_metrics({f"eval/{k}": v for k, v in metrics.items()}, step=self.step)
        return metrics

    def _autocast(self):
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @torch.no_grad()
    def _reference_logps(self, batch, mb: int) -> torch.Tensor:
        if self.ref_model is not None:
            model = self.ref_model
        else:
            model = self.model
        with contextlib.nullcontext() if self.ref_model is not None else self.model.disable_adapter():
            # LoRA: the base model (adapters off) is the reference
            return score_batch(
                model, batch, self.cfg.rollout.temperature, self.cfg.learner.micro_batch_tokens, mb, with_entropy=False
            )[0]

    # -- tasks, weights, checkpoints -------------------------------------------
    def draw_tasks(self, step: int) -> list[EpisodeSpec]:
        """This step's tasks: env by mixture weight, reset seed; a function of (seed, step) only."""
        rng = random.Random(self.cfg.seed * 1_000_003 + step)
        weights = [e.weight for e in self.cfg.envs]
        specs = []
        for i in range(self.cfg.tasks_per_step):
            env = rng.choices(self.cfg.envs, weights=weights)[0]
            seed = rng.randrange(self.cfg.task_seeds) if self.cfg.task_seeds else rng.randrange(2**31)
            specs.append(EpisodeSpec(functools.partial(make_env, env.name, dict(env.kwargs)), seed, f"{step}-{i}"))
        return specs

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The policy's weights under the plain model's names (LoRA merged in) for the rollout workers."""
        if not self.cfg.lora.enabled:
            return self.model.state_dict()
        return checkpoint.merged_lora_state(self.model)

    def save(self) -> Path:
        path = checkpoint.save(self.ckpt_dir, self.step, self.model, self.tokenizer, self.optimizer)
        checkpoint.prune(self.ckpt_dir, self.cfg.keep_checkpoints)
        return path


def _think_token_ids(tokenizer):
    """``<think>`` and ``</think>`` as token ids, or as the id sequences they tokenize to (no such tokens)."""
    ids = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    unk = tokenizer.unk_token_id
    if not any(i is None or i == unk for i in ids):
        return ids[0], ids[1]
    seqs = [tuple(tokenizer.encode(m, add_special_tokens=False)) for m in ("<think>", "</think>")]
    return (seqs[0], seqs[1]) if all(seqs) else None


def _with_lora(model, cfg: LoraConfig):
    from palaestra.shared.extras import require

    require("peft", "lora", "LoRA (lora.enabled)")
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules)
    )
    return get_peft_model(model, peft_cfg)  # wraps in place: the rollout client's model sees the adapters
