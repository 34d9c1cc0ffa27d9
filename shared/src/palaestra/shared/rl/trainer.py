"""The policy-gradient trainer shared by egpo and mars (and any package that plugs in).

A package adds parts by registry name (envs, task sources, rewards, advantage estimators, batch rules) and writes
a `TrainConfig` (rl/config.py); it does not subclass the trainer (docs/extending.md).

Lifecycle: ``Trainer(cfg, tracker, eval_hook, batch_rule)`` only builds the policy set (rl/policies.py: each
policy's model with float32 master weights, optimizer, checkpoint section and metric names). `prepare` resumes
(``resume: true``) or runs the SFT warm start (rl/sft.py), keeps each frozen reference (``loss.kl_coef`` > 0),
starts each policy's learner (rl/learner.py; sharded with ``learner.world_size`` > 1, rl/distributed.py) and the
rollouts, then the ``pilot`` pass (rl/pilot.py). `train` may be called again; `close` (or a ``with``) stops them.

The loop (`Trainer.train_step`), top to bottom:

1. rollout: the batch rule draws tasks (rl/batch_rules.py, rl/task_sampling.py) and keeps rows of the rollout
   (up to ``rollout.max_staleness`` steps ahead, rl/async_rollouts.py; ``dynamic_sampling``: rl/dynamic_sampling.py);
2. per policy, on its own agents' trajectories: old log-probs and entropies (skipped when exactly on-policy, as TRL);
3. reference log-probs (``loss.kl_coef`` > 0);
4. the advantage pipeline (rl/advantages.py);
5. the learner's PPO epochs over minibatches at the scheduled learning rate (rl/update.py, rl/optim.py);
6. weight sync to the rollouts (the version is the learner's step count);
7. metrics, then checkpoints every ``checkpoint_every`` steps (a non-finite loss stops, naming the last good one).

Evaluation: the eval hook ``fn(trainer, step) -> metrics`` runs before training (``eval_before``), every ``eval_every``
steps and at the end. The default (``eval_tasks`` > 0) is `evaluate`, on the training rollouts with ``eval``'s settings.
Metrics (MLflow, per step): each policy's ``train/...`` (under ``policy/<name>/`` with several), ``train/reward_mean``
over every trajectory, ``perf/rollout_s`` (the rollout's own wall time), ``perf/learner_wait_s`` (how long the
learner waited for it: less when it ran ahead), ``perf/tokens_per_s`` (generated tokens per rollout second),
``perf/step_s``, ``rollout/...`` and (dynamic sampling) ``batch/...`` counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from palaestra.shared.config import check_fields
from palaestra.shared.llm.sleep_mode import Colocation
from palaestra.shared.rl import checkpoint
from palaestra.shared.rl.advantages import AdvantageInput, EntropySpan, compute_advantages, reads_entropy
from palaestra.shared.rl.async_rollouts import RolloutStream, background_engine, behaviour_data, check_admission
from palaestra.shared.rl.batch import build_batch, think_entropy, token_advantages
from palaestra.shared.rl.batch_rules import make_batch_rule
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.dynamic_sampling import DynamicSampler
from palaestra.shared.rl.episodes import eval_specs, reward_summary
from palaestra.shared.rl.learner import LocalLearner
from palaestra.shared.rl.optim import optimizer_steps, step_learning_rate
from palaestra.shared.rl.pilot import run_pilot
from palaestra.shared.rl.policies import PolicySet, TrainedPolicy, build_policies, update_policies
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
        self.policies: PolicySet = build_policies(cfg)
        self.ckpt_dir = Path(cfg.output_dir) / "checkpoints"
        self.step = 0
        self.tasks = TaskSampler(cfg)  # task_sampling: with replacement, or epochs (rl/task_sampling.py)
        self.batch_rule = make_batch_rule(batch_rule, cfg, self.tasks)  # draws tasks, keeps rows (rl/batch_rules.py)
        self.dynamic = DynamicSampler(cfg, self.tasks)  # drops groups without signal, draws more (off by default)
        self.rollouts: LocalRollouts | RayRollouts | None = None
        self.stream: RolloutStream | None = None  # each step's rollout, up to rollout.max_staleness ahead
        self.eval_hook = eval_hook or (_default_eval if cfg.eval_tasks else None)
        self.eval_history: list[tuple[int, dict[str, float]]] = []
        self.resumed: bool | None = None  # None: not prepared yet

    @property
    def client(self):
        """The client evaluations sample from when they do not play on the rollouts (`PolicySet.base_client`)."""
        return self.policies.base_client

    # -- lifecycle ----------------------------------------------------------
    def prepare(self) -> None:
        """Resume or warm-start, keep the reference models, start the learners and rollouts (once; then a no-op)."""
        if self.resumed is None:
            self.resumed = self.resume()
            if not self.resumed:
                self.warm_start()
            self.init_reference()
        self.start_learner()
        self.start_rollouts()

    def resume(self) -> bool:
        """With ``resume: true``, restore weights, optimizers, RNG states and step from the newest checkpoint."""
        latest = checkpoint.latest(self.ckpt_dir) if self.cfg.resume else None
        self.step = checkpoint.load(latest, self.policies.checkpoint_parts()) if latest is not None else 0
        return latest is not None

    def warm_start(self) -> dict[str, float]:
        """The SFT stage (``sft_warmup.steps`` > 0), logged as sft/... at step 0 (rl/policies.py `warm_start`)."""
        if self.cfg.sft_warmup.steps <= 0:
            return {}
        metrics = self.policies.warm_start(lambda p: run_sft(p.model, p.tokenizer, p.cfg.sft_warmup, progress=True))
        self.tracker.log_metrics({f"sft/{k}": v for k, v in metrics.items()}, step=0)
        return metrics

    def init_reference(self) -> None:
        """Freeze a copy of each model in its compute dtype as its KL reference (saved once; a resumed run loads it).
        With LoRA the reference is the model with its adapters off: nothing to keep."""
        for p in self.policies:
            if not self.cfg.loss.kl_coef or p.cfg.lora.enabled or p.ref_model is not None:
                continue
            p.ref_model = p.reference_copy()  # in the compute dtype: bf16 with bf16 compute
            root = self.ckpt_dir / p.reference_dir
            if self.resumed:
                checkpoint.load_reference(root, p.ref_model)
            else:
                checkpoint.save_reference(root, p.ref_model)

    def start_learner(self) -> None:
        """Each policy's learner (rl/learner.py): `LocalLearner` on this process's model, or with
        ``learner.world_size`` > 1 a sharded one of its own (rl/distributed.py), restored on resume from its
        checkpoint section. This process keeps each model as the copy rollouts and checkpoints read."""
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
                reference_dir=str(self.ckpt_dir / p.reference_dir / "reference") if p.ref_model is not None else None,
                mirror=p.model,
                name=p.learner_name,
            )
            if latest is not None:
                p.learner.load(latest / p.section)
            p.ref_model = None  # its ranks hold the reference (it stays saved under its reference/)

    def start_rollouts(self) -> None:
        if self.rollouts is not None:
            return
        cfg, policies = self.cfg, self.policies
        k = cfg.rollout.max_staleness
        fixed = k > 0 and cfg.rollout.version_schedule == "fixed"  # rl/async_rollouts.py
        check_admission(cfg)
        if cfg.workers.num_workers > 0:
            w = cfg.workers
            self.rollouts = RayRollouts(
                w.llm or cfg.llm,
                cfg.rollout,
                w.num_workers,
                cfg.cluster,
                w.num_cpus,
                w.num_gpus,
                weight_sync=w.weight_sync,
                concurrent=k > 0 and not fixed,
                pin_versions=fixed,
                serving=policies.serving(w.llm),  # several policies: adapters on one base or a model each
            )
            self.rollouts.sync(policies.weights(), self.step)
        else:
            self.rollouts = LocalRollouts(policies.base_client, cfg.rollout, policies.client_of, policies.clients())
            self.rollouts.sync(None, self.step)
        self.colocation = Colocation.over(self.rollouts)  # engines built with sleep mode sleep through updates
        run_pilot(self)  # pilot pass (rl/pilot.py; off by default): may narrow the tasks, so the steps are after it
        seed = lambda step: cfg.seed * 100_003 + step  # noqa: E731
        # in-process rollouts ahead: their own copy of every policy (rl/async_rollouts.py)
        engine = lambda: background_engine(cfg, policies.weights(), self.step, policies.serving())  # noqa: E731
        ahead = (cfg.rollout.version_schedule, cfg.rollout.max_inflight)
        self.stream = RolloutStream(self.rollouts, k, self.draw_tasks, seed, engine, self.total_steps, *ahead)
        if self.resumed:  # the rollouts in flight at the checkpoint
            self.stream.restore(checkpoint.latest(self.ckpt_dir))

    def close(self) -> None:
        """Stop the rollout workers and learners (a later `train` starts them again)."""
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
        self.policies.eval()
        assert self.rollouts is not None and self.stream is not None  # prepare() started them
        result, sampled = self.dynamic.fill(self.step, self.stream.take(self.step), self.rollouts, self.batch_rule)
        waited = time.perf_counter() - t0  # the learner's wait: less than the rollout's time when it ran ahead
        check_failures(result, cfg.rollout.max_failed_share)  # warns; raises past the share
        trajs = [t for t in result.trajectories if not t.failed and t.num_response_tokens > 0]
        if not trajs:
            raise TrainingError(f"step {self.step}: no usable trajectories ({result.stats})")
        # 2.-5. per policy, on its own agents' trajectories
        self.colocation.sleep()  # colocated layouts (rl/layout.py): the engines free the GPU for the update
        updated = update_policies(self.policies.split(trajs), self.update_policy)  # at once on ranks of their own
        self.policies.eval()
        self.step += 1
        # 6. weight sync (version: the learner's step count); colocated: inside the engines' wake-up
        self.colocation.wake(self.stream.sync, self.policies.weights, self.step)
        # 7. metrics: each policy's under its names, the reward over every trajectory
        metrics = {f"{p.metric_prefix}{k}": v for p, m in updated for k, v in m.items()}
        rollout_s = result.stats["rollout_s"]  # the rollout's own wall time (the slowest worker's)
        metrics |= {
            "train/reward_mean": float(np.mean([t.total_reward for t in trajs])),
            "perf/tokens_per_s": result.stats["generated_tokens"] / max(rollout_s, 1e-9),
            "perf/step_s": time.perf_counter() - t0,
            "perf/rollout_s": rollout_s,
            "perf/learner_wait_s": waited,
            "rollout/failed": result.stats["failed"],
            "rollout/failed_episodes": result.stats["failed_episodes"],
            "rollout/truncated": result.stats["truncated"],
            "rollout/trajectories": len(trajs),
            "rollout/response_tokens_mean": float(np.mean([t.num_response_tokens for t in trajs])),
        } | sampled  # dynamic sampling's batch/... ({} when off)
        self.tracker.log_metrics(metrics, step=self.step)
        if cfg.log_samples:
            lines = [f"[{t.agent}] r={t.total_reward:+.3f} {t.turns[-1].text!r}" for t in trajs[: cfg.log_samples]]
            self.tracker.log_text("\n".join(lines), f"samples/step_{self.step:06d}.txt")
        return metrics

    def update_policy(self, policy: TrainedPolicy, trajs: list) -> dict[str, float]:
        """Steps 2-5 of the loop for `policy` on `trajs` (its agents'): old log-probs and entropies, reference
        log-probs, the advantage pipeline on these rows alone, its learner's update at its own scheduled rate.
        Returns the step's train/... metrics of this policy."""
        cfg, learner = policy.cfg, policy.learner
        assert learner is not None  # prepare() started it
        # 2. old log-probs and entropies (3. reference log-probs)
        split = cfg.rollout.context == "template"  # later prompts re-render: a row per run of turns (rl/batch.py)
        batch = build_batch(trajs, policy.tokenizer.pad_token_id, policy.think_ids, split)
        # old, ref, entropies None: on-policy, the update's own
        data = StepData(batch, advantages=torch.empty(0), step=self.step, steps=self.total_steps)
        if self.needs_scoring(len(batch)):
            data.old_logps, data.entropies = learner.score(batch)
        if cfg.loss.kl_coef:
            data.ref_logps = learner.score(batch, with_entropy=False, ref=True)[0]  # LoRA: adapters off
        stale: dict[str, float] = {}
        if self.asynchronous:  # the sampler's log-probs and versions: the correction and async/ metrics
            data.behaviour_logps, stale = behaviour_data(trajs, batch, cfg, self.step, data.old_logps, split)
        # 4. advantages
        entropy = data.entropies
        entropies = (None, None) if entropy is None else (think_entropy(entropy, batch, s) for s in EntropySpan)
        adv_in = AdvantageInput.from_trajectories(trajs, *entropies)
        values = compute_advantages(cfg.advantages, adv_in)
        data.advantages = token_advantages(values, batch)
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
        self.tracker.set_tags({"palaestra.eval_context": cfg.eval.context})  # the view the policy was shown
        self.tracker.log_metrics({f"eval/{k}": v for k, v in metrics.items()}, step=self.step)
        return metrics

    def eval_rollouts(self) -> LocalRollouts | RayRollouts:
        """Where evaluations play: the training rollouts (the same workers, backend and synced weights), each
        run given ``cfg.eval``'s settings as ``run(specs, seed, cfg.eval.rollout_config(cfg.rollout))``."""
        self.prepare()
        self.policies.eval()
        assert self.rollouts is not None  # prepare() started them
        return self.rollouts

    def needs_scoring(self, rows: int) -> bool:
        """False when the update is exactly on-policy (one PPO epoch, one minibatch) and no advantage step
        reads entropies: the old log-probs are the update's own, detached (as TRL does)."""
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
        return self.batch_rule.draw(step)  # the batch rule's draw (default: rl/task_sampling.py)

    def policy_state(self) -> dict[str, Any]:
        return self.policies.weights()  # what the rollouts load after an update

    def save(self) -> Path:
        """A checkpoint of every policy's section, each learner's own state and the rollouts in flight."""
        learners = [(p.section, p.learner) for p in self.policies if p.learner is not None]
        stream = self.stream
        if stream is not None:  # in-process rollouts sample with torch's random state, which the checkpoint reads
            stream.drain()

        def extra(directory: Path) -> None:
            for section, learner in learners:  # a sharded learner's shards, in its policy's section
                learner.save(directory / section)
            if stream is not None:
                stream.save(directory)

        path = checkpoint.save(self.ckpt_dir, self.step, self.policies.checkpoint_parts(), extra)
        checkpoint.prune(self.ckpt_dir, self.cfg.keep_checkpoints)
        return path


def _default_eval(trainer: Trainer, step: int) -> dict[str, float]:
    return trainer.evaluate()
