"""The policy-gradient trainer shared by egpo and mars (and any package that plugs in).

How a package plugs in
----------------------
Everything is chosen by registry name in a `TrainConfig` (rl/config.py), so a
package adds parts and writes a YAML config; it does not subclass the trainer::

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

    # 4. (optional) an evaluation run every ``eval_every`` steps: Trainer(cfg, tracker, eval_hook=fn)

    # 5. (optional) a batch rule: how a step's tasks are drawn and which rows of their rollout form the batch
    from palaestra.shared.rl.batch_rules import BATCH_RULES
    @BATCH_RULES.register("first_finished")   # entry points `palaestra.batch_rules`
    class FirstFinished: ...                  # draw(step) -> specs; select(step, result) -> result
    Trainer(cfg, tracker, batch_rule="first_finished")   # default "all": the drawn tasks, every row

Then a config (``job: rl.train``, or the package's own job)::

    job: rl.train
    llm: {model: tiny}                        # or Qwen/Qwen3-4B-Instruct-2507 with backend vllm on GPUs
    envs:                                     # a mixture: each task draws an env by weight
      - {name: task, weight: 1.0, kwargs: {source: bfcl_tasks, reward: fc_binary, source_kwargs: {path: ...}}}
    rollout: {group_size: 8, max_tokens_per_turn: 512, temperature: 0.7}
    advantages:                               # EGPO; MARS: [{name: turn_level}, {name: agent_norm}]
      - {name: grpo}
      - {name: entropy_clipped, options: {lam: 0.4, alpha: 2.0}}
    loss: {epsilon: 0.2, dual_clip: 3.0, kl_coef: 0.001, reduction: grpo}
    learner: {micro_batch_tokens: 16384, gradient_checkpointing: true}
    tasks_per_step: 16
    workers: {num_workers: 2}                 # 0: rollouts in the learner's process

Lifecycle: ``Trainer(cfg, tracker, eval_hook, batch_rule)`` only builds (model, optimizer;
rl/policy.py: float32 master weights, compute dtype, checkpointing, LoRA).
`prepare` then resumes from the newest checkpoint (``resume: true``) or runs
the SFT warm start (`warm_start`, rl/sft.py), keeps the frozen reference model
(`init_reference`, when ``loss.kl_coef`` > 0), starts the learner that then
scores and updates (rl/learner.py: `LocalLearner` on this process's model, or
with ``learner.world_size`` > 1 the sharded `DistributedLearner`,
rl/distributed.py; both run rl/update.py's one inner loop) and the rollout
workers; `train` (which prepares if the job has not) may be
called again to go on; `close` (or ``with Trainer(...) as trainer:``) stops them.

The loop (`Trainer.train_step`), top to bottom: draw tasks (the batch rule's `draw`, by default
``task_sampling``: with replacement or in epochs, rl/task_sampling.py) -> rollout (batched
across envs, locally or on Ray workers) -> the batch rule's `select` (rl/batch_rules.py)
-> old log-probs and entropies (skipped
when the update is exactly on-policy: one PPO epoch, one minibatch, no
advantage step reading entropies; the old log-probs are then the current ones
detached, as TRL does) -> reference log-probs (when ``loss.kl_coef`` > 0) ->
advantage pipeline -> the step's tensors (`update.StepData`) to the learner:
``ppo_epochs`` x minibatches of PPO-clip updates, each minibatch accumulated
over micro-batches of ``learner.micro_batch_tokens`` (rl/update.py), at the
scheduled learning rate (rl/optim.py) -> weight sync to workers -> MLflow metrics -> checkpoint. A
non-finite loss stops the run with a clear message; the last good checkpoint
stays. The resumed run continues exactly where it stopped.

With ``rollout.max_staleness`` k > 0 the rollouts of the next k steps run while
the learner updates (rl/async_rollouts.py: `RolloutStream`, the protocol), every
token tagged with the policy version that sampled it; the loss may correct the
gap per token (``loss.behaviour_correction``), and ``async/`` metrics report it.

Evaluation: the eval hook ``fn(trainer, step) -> metrics`` runs before
training (``eval_before``), every ``eval_every`` steps and at the end; it logs
its metrics (and any artifacts) at that step through ``trainer.tracker``, and
``trainer.eval_history`` keeps (step, metrics). The default hook (when
``eval_tasks`` > 0) is `Trainer.evaluate`: fixed tasks, ``eval/reward_mean``
with a 95% CI, ``eval/failed`` and ``eval/truncated``. Evaluations play on the
training rollouts (`eval_rollouts`: the same workers, backend and synced
weights) with ``eval``'s settings, whose unset fields are the rollout's
(context length, sampling, response prefix; rl/config.py `EvalConfig`).

Metrics (MLflow, per step): train/reward_mean, train/advantage_mean,
train/advantage_std, train/entropy, train/kl, train/clip_fraction, train/loss,
train/grad_norm, perf/tokens_per_s (generated tokens per rollout second),
perf/step_s, perf/rollout_s, rollout/failed, rollout/truncated,
rollout/trajectories, rollout/response_tokens_mean.

Several policies (``policies:``, rl/policies.py): each agent's turns are sampled by its policy's model,
and steps 2-5 run per policy on its own agents' trajectories (its advantages, update, schedule), its
metrics under ``policy/<name>/...``; every policy is saved and resumed (its checkpoint subdirectory).
Each has its own learner: with ``learner.world_size`` > 1 (the run's or its own) a sharded learner of its
own, whose ranks, reference and shards are its alone. Without the section one policy plays every agent,
exactly as before.

Small models on CPU: the RL learning rate wants to be far below the SFT one
(Adam moves every weight by about lr per step); see experiments/shared/toy_rl.yaml.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from palaestra.shared.config import check_fields
from palaestra.shared.rl import checkpoint
from palaestra.shared.rl.advantages import AdvantageInput, EntropySpan, compute_advantages, reads_entropy
from palaestra.shared.rl.async_rollouts import RolloutStream, background_engine, behaviour_data, check_admission
from palaestra.shared.rl.batch import build_batch, think_entropy, token_advantages
from palaestra.shared.rl.batch_rules import make_batch_rule
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.episodes import eval_specs, reward_summary
from palaestra.shared.rl.learner import Learner, LocalLearner
from palaestra.shared.rl.optim import optimizer_steps, step_learning_rate
from palaestra.shared.rl.policies import (
    Policy,
    adapter_states,
    agent_clients,
    build_policies,
    split_by_policy,
    warm_start_from,
    worker_serving,
)
from palaestra.shared.rl.policy import policy_state, think_token_ids
from palaestra.shared.rl.sft import run_sft
from palaestra.shared.rl.task_sampling import TaskSampler
from palaestra.shared.rl.update import NonFiniteLoss, StepData
from palaestra.shared.rollout.engine import EpisodeSpec, check_failures
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts
from palaestra.shared.tracking import Tracker

EvalHook = Callable[["Trainer", int], dict[str, float]]


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the message says where the last good checkpoint is."""


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        tracker: Tracker | None = None,
        eval_hook: EvalHook | None = None,
        batch_rule: str = "all",
    ):
        check_fields(cfg)  # a config built in code gets the checks a resolved one had
        self.cfg, self.tracker = cfg, tracker or Tracker(cfg.tracking)
        # model (float32 master weights) and optimizer of every policy (rl/policies.py); one without `policies`
        self.policies: list[Policy] = build_policies(cfg)
        self.tokenizer = self.client.tokenizer
        self.device = next(self.model.parameters()).device
        self.ckpt_dir = Path(cfg.output_dir) / "checkpoints"
        self.step = 0
        self.think_ids = think_token_ids(self.tokenizer)
        self.tasks = TaskSampler(cfg)  # task_sampling: with replacement, or epochs (rl/task_sampling.py)
        self.batch_rule = make_batch_rule(batch_rule, cfg, self.tasks)  # draws tasks, keeps rows (rl/batch_rules.py)
        self.rollouts: LocalRollouts | RayRollouts | None = None
        self.stream: RolloutStream | None = None  # each step's rollout, up to rollout.max_staleness ahead
        self.eval_hook = eval_hook or (_default_eval if cfg.eval_tasks else None)
        self.eval_history: list[tuple[int, dict[str, float]]] = []
        self.resumed: bool | None = None  # None: not prepared yet

    # -- the first policy (the only one without `policies`): what evaluations and packages read ---------------
    @property
    def client(self):
        return self.policies[0].client

    @property
    def model(self) -> torch.nn.Module:
        return self.policies[0].model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.policies[0].optimizer

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.policies[0].compute_dtype

    @property
    def ref_model(self) -> torch.nn.Module | None:
        return self.policies[0].ref_model

    @property
    def learner(self) -> Learner | None:
        """Started by `prepare`: LocalLearner, or the ranks (rl/distributed.py)."""
        return self.policies[0].learner

    @property
    def several(self) -> bool:
        """A ``policies`` section: per-policy checkpoints (also with one policy)."""
        return bool(self.cfg.policies)

    # -- lifecycle ----------------------------------------------------------
    def prepare(self) -> None:
        """Resume or warm-start, keep the reference model, start the rollout workers (once; then a no-op)."""
        if self.resumed is None:
            self.resumed = self.resume()
            if not self.resumed:
                self.warm_start()
            self.init_reference()
        self.start_learner()
        self.start_rollouts()

    def resume(self) -> bool:
        """With ``resume: true``, restore weights, optimizer, RNG states and step from the newest checkpoint."""
        latest = checkpoint.latest(self.ckpt_dir) if self.cfg.resume else None
        if latest is not None and self.several:
            parts = {p.name: (p.model, p.optimizer, p.adapter) for p in self.policies}
            self.step = checkpoint.load_policies(latest, parts)
        elif latest is not None:
            self.step = checkpoint.load(latest, self.model, self.optimizer)
        return latest is not None

    def warm_start(self) -> dict[str, float]:
        """The SFT stage on the learner's model (``sft_warmup.steps`` > 0), logged as sft/... at step 0."""
        if self.cfg.sft_warmup.steps <= 0:
            return {}
        metrics = run_sft(self.model, self.tokenizer, self.cfg.sft_warmup, progress=True)
        self.tracker.log_metrics({f"sft/{k}": v for k, v in metrics.items()}, step=0)
        for p in self.policies[1:]:  # several policies start from the one warm start (rl/policies.py)
            warm_start_from(p, self.policies[0], lambda q: run_sft(q.model, q.client.tokenizer, q.cfg.sft_warmup))
        return metrics

    def init_reference(self) -> None:
        """Freeze a copy of the current model as the KL reference (saved once; a resumed run loads it).
        With LoRA the reference is the model with its adapters off: nothing to keep."""
        for p in self.policies:
            if not self.cfg.loss.kl_coef or p.cfg.lora.enabled or p.ref_model is not None:
                continue
            p.ref_model = copy.deepcopy(p.model).eval().requires_grad_(False)
            root = self.reference_root(p)
            if self.resumed:
                checkpoint.load_reference(root, p.ref_model)
            else:
                checkpoint.save_reference(root, p.ref_model)

    def start_learner(self) -> None:
        """Each policy's learner (rl/learner.py) with its own optimizer and learner settings (``p.cfg``):
        `LocalLearner` on this process's model, or with its ``learner.world_size`` > 1 a sharded learner of its
        own (its ranks, process group and reference; rl/distributed.py), started from this model's weights
        (after the warm start or resume) and, on resume, restored from its sharded weights and optimizer state
        (in its policy's subdirectory with a ``policies`` section). This process keeps each model as the copy the
        rollouts and checkpoints read, refreshed after every update. The policies' ranks start one group after
        another: a group's rank 0 holds its rendezvous port before the next group's rank 0 picks one."""
        latest = checkpoint.latest(self.ckpt_dir) if self.resumed else None
        for p in self.policies:
            if p.learner is not None:
                continue
            if p.cfg.learner.world_size <= 1:
                p.learner = LocalLearner(p.cfg, p.model, p.optimizer, p.compute_dtype, p.ref_model, p.adapter)
                continue
            from palaestra.shared.rl.distributed import DistributedLearner

            p.learner = DistributedLearner(
                p.cfg,
                initial_state=p.model.state_dict(),
                reference=p.ref_model is not None,
                reference_dir=str(self.reference_root(p) / "reference") if p.ref_model is not None else None,
                mirror=p.model,
                name=f"policy {p.name}'s learner" if self.several else "the learner",
            )
            if latest is not None:  # a policies section: its subdirectory of the checkpoint
                p.learner.load(latest / p.name if self.several else latest)
            p.ref_model = None  # its ranks hold the reference (it stays saved under its reference/)

    def reference_root(self, policy: Policy) -> Path:
        """The directory holding `policy`'s reference/ (rl/checkpoint.py): its own with a ``policies`` section."""
        return self.ckpt_dir / "policies" / policy.name if self.several else self.ckpt_dir

    def start_rollouts(self) -> None:
        if self.rollouts is not None:
            return
        cfg = self.cfg
        k, steps = cfg.rollout.max_staleness, self.total_steps
        fixed = k > 0 and cfg.rollout.version_schedule == "fixed"  # rl/async_rollouts.py
        check_admission(cfg)
        if cfg.workers.num_workers > 0:
            w = cfg.workers
            llm = w.llm or cfg.llm
            self.rollouts = RayRollouts(
                llm,
                cfg.rollout,
                w.num_workers,
                cfg.cluster,
                w.num_cpus,
                w.num_gpus,
                weight_sync=w.weight_sync,
                concurrent=k > 0 and not fixed,
                pin_versions=fixed,
                serving=worker_serving(self.policies, w.llm),  # several policies: adapters or a model each
            )
            self.rollouts.sync(self.policy_state(), self.step)
        else:
            clients = [p.client for p in self.policies] if len(self.policies) > 1 else []
            self.rollouts = LocalRollouts(self.client, cfg.rollout, agent_clients(self.policies), clients)
            self.rollouts.sync(None, self.step)
        seed = lambda step: cfg.seed * 100_003 + step  # noqa: E731
        # in-process rollouts ahead: their own copy of every policy (rl/async_rollouts.py)
        serving = worker_serving(self.policies)
        engine = lambda: background_engine(cfg, self.policy_state(), self.step, serving)  # noqa: E731
        ahead = (cfg.rollout.version_schedule, cfg.rollout.max_inflight)
        self.stream = RolloutStream(self.rollouts, k, self.draw_tasks, seed, engine, steps, *ahead)
        if self.resumed:  # the rollouts in flight at the checkpoint
            self.stream.restore(checkpoint.latest(self.ckpt_dir))

    def close(self) -> None:
        """Stop the rollout workers (a later `train` starts them again)."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self.rollouts is not None:
            self.rollouts.close()
            self.rollouts = None
        for p in self.policies:
            if p.learner is not None:
                p.learner.close()
                p.learner = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------
    def train(self) -> dict[str, float]:
        """Train up to ``cfg.steps``: evaluations before, every ``eval_every`` steps and at the end; a checkpoint
        at the end. Returns the summary (``eval_before_*`` / ``eval_after_*``: the hook's first and last)."""
        self.prepare()
        cfg, history, evals = self.cfg, [], []
        if self.eval_hook and cfg.eval_before:
            evals.append(self.run_eval())
        steps = self.total_steps
        with tqdm(total=steps, initial=self.step, desc="rl steps") as bar:
            while self.step < steps:
                metrics = self.train_step()
                history.append(metrics)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['train/reward_mean']:.3f}")
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save()
                if self.eval_hook and cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < steps:
                    evals.append(self.run_eval())
        if not cfg.checkpoint_every or self.step % cfg.checkpoint_every:
            self.save()
        if self.eval_hook:
            evals.append(self.run_eval())
        summary: dict[str, float] = {"steps": self.step}
        if evals:
            summary.update({f"eval_before_{k}": v for k, v in evals[0].items()} if cfg.eval_before else {})
            summary.update({f"eval_after_{k}": v for k, v in evals[-1].items()})
        summary["reward_first"] = history[0]["train/reward_mean"] if history else math.nan
        summary["reward_last"] = history[-1]["train/reward_mean"] if history else math.nan
        return summary

    def run_eval(self) -> dict[str, float]:
        """The eval hook at the current step (once per step: a repeated call returns the same metrics)."""
        if self.eval_history and self.eval_history[-1][0] == self.step:
            return self.eval_history[-1][1]
        assert self.eval_hook is not None, "no eval hook (eval_tasks is 0)"
        metrics = self.eval_hook(self, self.step)
        self.eval_history.append((self.step, metrics))
        return metrics

    def train_step(self) -> dict[str, float]:
        self.prepare()
        cfg, t0 = self.cfg, time.perf_counter()
        # 1. rollout
        for p in self.policies:
            p.model.eval()
        assert self.rollouts is not None and self.stream is not None  # prepare() started them
        result = self.batch_rule.select(self.step, self.stream.take(self.step))
        check_failures(result, cfg.rollout.max_failed_share)  # warns; raises past the share
        trajs = [t for t in result.trajectories if not t.failed and t.num_response_tokens > 0]
        if not trajs:
            raise TrainingError(f"step {self.step}: no usable trajectories ({result.stats})")
        t_rollout = time.perf_counter() - t0
        # 2.-5. per policy, on its own agents' trajectories (one policy: all of them)
        updated = [(p, self.update_policy(p, rows)) for p, rows in split_by_policy(self.policies, trajs)]
        for p in self.policies:
            p.model.eval()
        self.step += 1
        # 6. weight sync (version: the learner's step count)
        self.stream.sync(self.policy_state, self.step)
        # 7. metrics
        step_s = time.perf_counter() - t0
        if len(self.policies) == 1:
            metrics = dict(updated[0][1])
        else:  # each policy's under policy/<name>/..., the reward over every trajectory as before
            metrics = {f"policy/{p.name}/{k}": v for p, m in updated for k, v in m.items()}
            metrics["train/reward_mean"] = float(np.mean([t.total_reward for t in trajs]))
        metrics |= {
            "perf/tokens_per_s": result.stats["generated_tokens"] / max(t_rollout, 1e-9),
            "perf/step_s": step_s,
            "perf/rollout_s": t_rollout,
            "rollout/failed": result.stats["failed"],
            "rollout/failed_episodes": result.stats["failed_episodes"],
            "rollout/truncated": result.stats["truncated"],
            "rollout/trajectories": len(trajs),
            "rollout/response_tokens_mean": float(np.mean([t.num_response_tokens for t in trajs])),
        }
        self.tracker.log_metrics(metrics, step=self.step)
        if cfg.log_samples:
            lines = [f"[{t.agent}] r={t.total_reward:+.3f} {t.turns[-1].text!r}" for t in trajs[: cfg.log_samples]]
            self.tracker.log_text("\n".join(lines), f"samples/step_{self.step:06d}.txt")
        return metrics

    def update_policy(self, policy: Policy, trajs: list) -> dict[str, float]:
        """Steps 2-5 of the loop for `policy` on `trajs` (its agents'): old log-probs and entropies, reference
        log-probs, the advantage pipeline on these rows alone, its learner's update at its own scheduled rate.
        Returns the step's train/... metrics of this policy."""
        cfg, learner = policy.cfg, policy.learner
        assert learner is not None  # prepare() started it
        # 2. old log-probs and entropies (3. reference log-probs)
        batch = build_batch(trajs, self.tokenizer.pad_token_id, self.think_ids)
        # old, ref, entropies None: on-policy, the update's own
        data = StepData(batch, advantages=torch.empty(0), step=self.step, steps=self.total_steps)
        if self.needs_scoring(len(batch)):
            data.old_logps, data.entropies = learner.score(batch)
        if cfg.loss.kl_coef:
            data.ref_logps = learner.score(batch, with_entropy=False, ref=True)[0]  # LoRA: adapters off
        stale: dict[str, float] = {}
        if self.asynchronous:  # the sampler's log-probs and versions: the correction and async/ metrics
            data.behaviour_logps, stale = behaviour_data(trajs, batch, cfg, self.step, data.old_logps)
        # 4. advantages
        entropy = data.entropies
        entropies = (None, None) if entropy is None else (think_entropy(entropy, batch, s) for s in EntropySpan)
        adv_in = AdvantageInput.from_trajectories(trajs, *entropies)
        values = compute_advantages(cfg.advantages, adv_in)
        data.advantages = token_advantages(values, batch.turn_index)
        # 5. PPO epochs over minibatches, each optimizer step at its scheduled learning rate (rl/optim.py)
        lr = step_learning_rate(cfg, self.step, data.steps, 0, optimizer_steps(cfg, len(batch)))
        try:
            updates = learner.update(data)
        except NonFiniteLoss as e:
            last = checkpoint.latest(self.ckpt_dir)
            raise TrainingError(
                f"{e}; stopping. Last good checkpoint: {last or 'none (no checkpoint saved yet)'}"
            ) from None
        flat_adv = np.concatenate(values)
        return {
            "train/reward_mean": float(np.mean([t.total_reward for t in trajs])),
            "train/advantage_mean": float(flat_adv.mean()),
            "train/advantage_std": float(flat_adv.std()),
            **adv_in.stats,  # what advantage steps report of their effect (entropy_clipped: adv/entropy_*)
            "train/lr": lr,
            **{f"train/{k}": v for k, v in updates.items()},
            **stale,
        }

    def evaluate(self) -> dict[str, float]:
        """Mean reward per trajectory over fixed tasks, with a 95% confidence interval (normal approximation),
        and the failed and truncated trajectories counted (rl/episodes.py `reward_summary`)."""
        rollouts, cfg = self.eval_rollouts(), self.cfg
        result = rollouts.run(eval_specs(cfg), cfg.seed * 100_003 - 1, cfg.eval.rollout_config(cfg.rollout))
        metrics = reward_summary(result)
        self.tracker.log_metrics({f"eval/{k}": v for k, v in metrics.items()}, step=self.step)
        return metrics

    def eval_rollouts(self) -> LocalRollouts | RayRollouts:
        """Where evaluations play: the training rollouts (the same workers and backend, e.g. vLLM, holding the
        weights of the last sync), each run given the evaluation's settings (``cfg.eval``: unset fields are the
        rollout's) as ``run(specs, seed, cfg.eval.rollout_config(cfg.rollout))``."""
        self.prepare()
        self.model.eval()
        assert self.rollouts is not None  # prepare() started them
        return self.rollouts

    def needs_scoring(self, rows: int) -> bool:
        """False when the update is exactly on-policy (one PPO epoch, one minibatch) and no advantage step
        reads entropies: the old log-probs are then the update's current ones detached (ratio 1, the same
        gradient), as TRL does, and that forward is skipped."""
        on_policy = self.cfg.ppo_epochs == 1 and (self.cfg.minibatch_size or rows) >= rows
        return not on_policy or reads_entropy(self.cfg.advantages) or self.asynchronous

    @property
    def asynchronous(self) -> bool:
        """Rollouts ahead of the learner or a behaviour correction: the step reads the sampler's log-probs."""
        return self.cfg.rollout.max_staleness > 0 or self.cfg.loss.behaviour_correction != "off"

    # -- tasks, weights, checkpoints -------------------------------------------
    @property
    def total_steps(self) -> int:
        """The run's RL steps: ``steps``, or with ``task_sampling: epochs`` and ``epochs`` > 0 those epochs' steps."""
        return self.tasks.steps()

    def draw_tasks(self, step: int) -> list[EpisodeSpec]:
        """This step's tasks (the batch rule's draw; by default ``task_sampling``: rl/task_sampling.py)."""
        return self.batch_rule.draw(step)

    def policy_state(self) -> dict[str, Any]:
        """The policy's weights under the plain model's names (LoRA merged in) for the rollout workers; LoRA
        policies on one base: every adapter's tensors alone, by adapter (rl/policies.py `adapter_states`);
        several policies each with its model: each one's weights (as one policy's), by policy."""
        if self.policies[0].adapter is not None:
            return adapter_states(self.policies)
        if len(self.policies) > 1:
            return {p.name: policy_state(p.model, p.cfg.lora.enabled) for p in self.policies}
        return policy_state(self.model, self.cfg.lora.enabled)

    def _checkpoint_extra(self) -> Callable[[Path], None]:
        """A checkpoint's parts beyond the models and optimizers: each policy's learner's (a sharded learner's
        shards, in its policy's subdirectory with a ``policies`` section; none before the learners start) and
        the rollouts in flight (rl/async_rollouts.py), waited for first: in-process ones sample with torch's
        random state, which the checkpoint reads."""
        learners = [(p.name, p.learner) for p in self.policies if p.learner is not None]
        several, stream = self.several, self.stream
        if stream is not None:
            stream.drain()

        def extra(directory: Path) -> None:
            for name, learner in learners:
                learner.save(directory / name if several else directory)
            if stream is not None:
                stream.save(directory)

        return extra

    def save(self) -> Path:
        # what the learners hold beyond these models and optimizers (the ranks' shards), and the rollouts in flight
        extra = self._checkpoint_extra()
        if self.several:  # one subdirectory per policy (rl/policies.py)
            parts = {p.name: (p.model, p.client.tokenizer, p.optimizer, p.adapter) for p in self.policies}
            path = checkpoint.save_policies(self.ckpt_dir, self.step, parts, extra)
        else:
            path = checkpoint.save(self.ckpt_dir, self.step, self.model, self.tokenizer, self.optimizer, extra)
        checkpoint.prune(self.ckpt_dir, self.cfg.keep_checkpoints)
        return path


def _default_eval(trainer: Trainer, step: int) -> dict[str, float]:
    return trainer.evaluate()
