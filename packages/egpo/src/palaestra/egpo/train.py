"""EGPO training (job ``egpo.train``) through the shared trainer (`palaestra.shared.rl.trainer`).

EGPO = GRPO's group-normalized advantage plus the entropy term of the chain of thought,
A + λ·clip(H, -|A|/α, |A|/α) (the shared ``entropy_clipped`` step after ``grpo``), with the strict
binary reward ``fc_binary``. This module adds what the trainer needs by name:

- task source ``fc_tasks`` (`TASKS`, in `palaestra.egpo.fc_tasks`): single-turn FC tasks from a JSONL
  file, a BFCL category or code; ``with_answers: true`` samples are what the SFT warm start trains on;
- environment ``bfcl_multi_turn`` (`ENVS`): BFCL's multi-turn entries, the reward from BFCL's
  multi-turn checker (state and results).

The job is the trainer's config (`TrainConfig`) with EGPO's defaults, plus an optional BFCL
evaluation of the trained policy at the end, logged in the same MLflow run. GRPO vs EGPO is the
``advantages`` list with or without the ``entropy_clipped`` step (see experiments/egpo/ablation.yaml).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import palaestra.egpo.fc_tasks  # noqa: F401  (registers the `fc_tasks` task source)
import palaestra.egpo.multiturn_data  # noqa: F401  (registers the `datagen_multi_turn` env)
from palaestra.egpo.bfcl_handler import DEFAULT_MODEL
from palaestra.egpo.eval import Decoder, PromptFormat
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import job
from palaestra.shared.rl.advantages import AdvantageStep
from palaestra.shared.rl.config import EnvSpec, EvalConfig, TaskSampling, TrainConfig
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.train import train_headline
from palaestra.shared.rollout.chat_tokens import ContextView
from palaestra.shared.rollout.env import ENVS
from palaestra.shared.tracking import Tracker

if TYPE_CHECKING:
    from palaestra.shared.rl.trainer import Trainer


@ENVS.register("bfcl_multi_turn")  # type: ignore[arg-type]  # a factory of envs: the registry calls it
def bfcl_multi_turn(category: str = "multi_turn_base", limit: int | None = None):
    """BFCL multi-turn entries of `category`; ``reset(seed)`` plays entry ``seed % count``."""
    from palaestra.egpo.bfcl import load_category
    from palaestra.egpo.multiturn import BFCLMultiTurnEnv

    pairs = load_category(category, limit)

    class _Env(BFCLMultiTurnEnv):
        env_type = f"bfcl_{category}"
        num_tasks = len(pairs)  # for task_sampling: epochs (palaestra.shared.rl.task_sampling)

        def reset(self, seed: int | None = None) -> dict[str, Any]:
            entry, truth = pairs[(seed or 0) % len(pairs)]
            self.entry, self.ground_truth = entry, truth or []
            return super().reset(seed)

    return _Env(pairs[0][0], pairs[0][1] or [])


def _egpo_advantages() -> list[AdvantageStep]:
    return [AdvantageStep("grpo"), AdvantageStep("entropy_clipped", {"lam": 0.4, "alpha": 2.0})]


@dataclass
class EvalAfterConfig(EvalConfig):
    """A BFCL evaluation of the trained policy at the end of training (same MLflow run). The sampling fields are
    `EvalConfig`'s (unset: the training rollout's), used by the default evaluation (``eval_tasks``) and by BFCL's
    (``temperature``, ``top_p``, ``max_tokens_per_turn``, ``max_context_tokens``); with ``categories`` set, an unset
    ``temperature`` is 0 (BFCL's runner samples at 0.001), ``group_size`` is 1 (BFCL plays each entry once: any
    other value is refused) and ``context`` is ``template`` (BFCL's runner re-renders each turn), so the resolved
    config shows what the BFCL evaluation ran with."""

    categories: list[str] = field(default_factory=list)
    """BFCL categories (empty: no evaluation)."""
    limit: int | None = 5
    """Entries per category."""
    limits: dict[str, int] = field(default_factory=dict)
    """Entries of the categories named here (instead of ``limit``)."""
    max_model_calls: int = 8
    """Model responses per BFCL multi-turn episode."""
    prompt: PromptFormat = PromptFormat.palaestra
    """palaestra (our system prompt) | bfcl_fc (BFCL's FC-mode messages and function docs; `BfclEvalConfig.prompt`)."""
    decoder: Decoder = Decoder.palaestra
    """palaestra | bfcl (BFCL's handler of ``bfcl_model`` and BFCL's runner; `BfclEvalConfig.decoder`)."""
    bfcl_model: str = DEFAULT_MODEL
    """The BFCL model key whose handler decodes, prompts and names the result files (`BfclEvalConfig.bfcl_model`)."""


@dataclass
class EGPOTrainConfig(TrainConfig):
    """EGPO: GRPO + the clipped chain-of-thought entropy term, binary function-calling reward."""

    envs: list[EnvSpec] = field(
        default_factory=lambda: [
            EnvSpec("task", {"source": "fc_tasks", "reward": "fc_binary", "source_kwargs": {"synthetic": 64}})
        ]
    )
    advantages: list[AdvantageStep] = field(default_factory=_egpo_advantages)
    loss: LossConfig = field(default_factory=lambda: LossConfig(kl_coef=0.001))
    eval: EvalAfterConfig = field(default_factory=EvalAfterConfig)
    contamination_check: bool = True
    """Run every training set through BFCL's contamination check before training and log what it found as the
    artifact ``data/contamination.json`` (`check_training_sets`)."""

    def __post_init__(self) -> None:
        if self.eval.categories:  # BFCL's protocol where the section leaves it open (before the rollout's fill-in)
            if self.eval.temperature is None:
                self.eval.temperature = 0.0
            if self.eval.group_size is None:
                self.eval.group_size = 1
            if self.eval.group_size != 1:
                raise ConfigError(f"eval.group_size {self.eval.group_size}: BFCL's evaluation plays each entry once")
            if self.eval.context is None:  # BFCL's runner re-renders the conversation every turn
                self.eval.context = ContextView.template
        super().__post_init__()


class BfclAtEnd:
    """egpo's eval hook: BFCL on the trained policy at the end of training (``eval.categories``), logged in the
    run, played on the trainer's rollout workers (`Trainer.eval_rollouts`: vLLM where ``workers.llm`` says so,
    holding the weights of the saved checkpoint); before and during training the default evaluation when
    ``eval_tasks`` > 0. ``result`` keeps the BFCL summary with its headline."""

    def __init__(self, cfg: EGPOTrainConfig, tracker: Tracker):
        self.cfg, self.tracker = cfg, tracker
        self.result: dict[str, Any] = {}

    def __call__(self, trainer: Trainer, step: int) -> dict[str, float]:
        from palaestra.egpo.eval import BfclEvalConfig, evaluate_with_client
        from palaestra.shared.rl import checkpoint

        metrics = trainer.evaluate() if self.cfg.eval_tasks else {}
        if step < trainer.total_steps:
            return metrics
        cfg = self.cfg
        trained = checkpoint.latest(trainer.ckpt_dir)  # the policy evaluated: named by its saved checkpoint
        eval_cfg = BfclEvalConfig(
            llm=dataclasses.replace(cfg.llm, model=str(trained)) if trained else cfg.llm,
            categories=list(cfg.eval.categories),
            limit=cfg.eval.limit,
            limits=dict(cfg.eval.limits),
            max_tokens_per_turn=cfg.eval.max_tokens_per_turn or cfg.rollout.max_tokens_per_turn,
            max_context_tokens=cfg.eval.max_context_tokens,
            max_model_calls=cfg.eval.max_model_calls,
            temperature=cfg.eval.temperature or 0.0,
            top_p=cfg.eval.top_p if cfg.eval.top_p is not None else 1.0,
            prompt=cfg.eval.prompt,
            decoder=cfg.eval.decoder,
            bfcl_model=cfg.eval.bfcl_model,
            context=cfg.eval.context or ContextView.template,
            seed=cfg.seed,
            output_dir=f"{cfg.output_dir}/eval",
        )
        # on the trainer's rollout workers (vLLM where workers.llm says so), holding the weights of that checkpoint
        self.result = evaluate_with_client(eval_cfg, trainer.client, self.tracker, trainer.eval_rollouts())
        return {**metrics, **{k: v for k, v in self.result.items() if isinstance(v, int | float)}}


def check_training_sets(cfg) -> dict[str, Any]:
    """What BFCL's contamination check (`palaestra.egpo.bfcl_contamination`) finds in every training set of an
    ``egpo.train`` config, the RL task mixture and the SFT warm start: the public sets through their source's own
    check (``public_fc_tasks``, which drops the hits by default), any other task source, SFT file and datagen
    multi-turn file in report mode (what it found, nothing dropped): ``{set label:
    report}``, a report as `BfclQueryIndex.summary` plus where the set came from and what was done with the hits
    (``drop`` / ``report``); an env that carries no task texts of its own says so."""
    from palaestra.egpo.bfcl_contamination import BfclQueryIndex
    from palaestra.egpo.multiturn_data import load_rows
    from palaestra.egpo.public_data import public_fc_report
    from palaestra.shared.rollout.tasks import TASKS

    index = BfclQueryIndex.from_bfcl()

    def of_samples(source: str, samples: list[dict]) -> dict[str, Any]:
        return {"source": source, "action": "report", **index.summary(samples, index.sample_hits(samples))}

    def of_source(source: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        if source == "public_fc_tasks":  # the source's own check, run before it returns anything
            report = public_fc_report(**kwargs)
            parts = report["sources"].values()
            totals = {k: sum(p.get(k, 0) for p in parts) for k in ("checked", "contaminated", "kept")}
            return {"source": source, "action": report["contamination"], **totals, **report}
        return of_samples(source, TASKS.get(source)(**kwargs))

    sets: dict[str, Any] = {}
    for i, env in enumerate(cfg.envs):
        label, kw = f"envs.{i}.{env.name}", env.kwargs
        if env.name == "task":
            sets[label] = of_source(kw.get("source", "next_number"), dict(kw.get("source_kwargs") or {}))
        elif env.name == "datagen_multi_turn":
            rows = load_rows(kw["path"], kw.get("limit"))
            samples = [{"id": e["id"], "messages": [m for turn in e["question"] for m in turn]} for e, _ in rows]
            sets[label] = of_samples(str(kw["path"]), samples)
        else:
            sets[label] = {"source": env.name, "action": "none", "note": "not checked: no task texts of its own"}
    sft = cfg.sft_warmup
    if sft.steps and (sft.source or sft.data_path):
        from palaestra.shared.rl.sft import load_samples

        if sft.source:
            sets["sft_warmup"] = of_source(sft.source, dict(sft.source_kwargs))
        else:
            sets["sft_warmup"] = of_samples(str(sft.data_path), load_samples(sft))
    return sets


def log_contamination(cfg: EGPOTrainConfig, tracker: Tracker) -> dict[str, Any]:
    """BFCL's contamination check of every training set (`check_training_sets`), logged in the run: the artifact
    ``data/contamination.json``, metrics ``data/<set>/contaminated`` and ``/checked``, and one line per set."""
    try:
        sets = check_training_sets(cfg)
    except ImportError as err:  # bfcl-eval (BFCL's test questions) is an optional install
        print(f"egpo.train: WARNING: training sets not checked for BFCL contamination: {err}", flush=True)
        tracker.log_dict({"not_checked": str(err)}, "data/contamination.json")
        return {}
    tracker.log_dict(sets, "data/contamination.json")
    metrics = {}
    for label, report in sets.items():
        if "checked" in report:
            metrics[f"data/{label}/checked"] = float(report["checked"])
            metrics[f"data/{label}/contaminated"] = float(report["contaminated"])
        found = f"{report.get('contaminated', 0)} of {report['checked']}" if "checked" in report else "-"
        print(f"egpo.train: BFCL contamination check, {label} ({report['source']}): {found} "
              f"({report['action']})", flush=True)  # fmt: skip
    tracker.log_metrics(metrics)
    return sets


@job("egpo.train", EGPOTrainConfig)
def train(cfg: EGPOTrainConfig, tracker: Tracker) -> dict:
    """EGPO (or GRPO, by the advantage list) on function-calling tasks through the shared trainer."""
    from palaestra.shared.rl.trainer import Trainer

    if cfg.eval.categories:  # before training: a wrong BFCL setting fails now, not after the run
        from palaestra.egpo.eval import check_bfcl_settings

        check_bfcl_settings(cfg.eval)
    if cfg.contamination_check:
        log_contamination(cfg, tracker)
    bfcl = BfclAtEnd(cfg, tracker) if cfg.eval.categories else None
    with Trainer(cfg, tracker, eval_hook=bfcl) as trainer:
        if cfg.task_sampling == TaskSampling.epochs and cfg.epochs:
            steps, tasks = trainer.total_steps, trainer.tasks.num_tasks
            tracker.log_params({"derived.steps": steps, "derived.num_tasks": tasks})
            print(f"egpo.train: {cfg.epochs} epochs over {tasks} tasks = {steps} steps", flush=True)
        trainer.prepare()  # resume or SFT warm start, reference model, rollout workers
        out: dict[str, Any] = dict(trainer.train())
    if bfcl is not None:
        out.update(bfcl.result)
    out.setdefault("headline", train_headline(out))  # the BFCL accuracy when evaluated, else the training reward
    return out
