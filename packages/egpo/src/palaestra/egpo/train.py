"""EGPO training (job ``egpo.train``) through the shared trainer (`palaestra.shared.rl.trainer`).

EGPO = GRPO's group-normalized advantage plus the entropy term of the chain of thought,
A + λ·clip(H, -|A|/α, |A|/α) (the shared ``entropy_clipped`` step after ``grpo``), with the strict
binary reward ``fc_binary``. This module adds what the trainer needs by name:

- task source ``fc_tasks`` (`TASKS`): single-turn FC tasks from a JSONL file (datagen's output,
  xLAM/APIGen style, or explicit ground truth), from a BFCL category, or generated in code
  (`palaestra.egpo.synthetic`); ``with_answers: true`` adds the reference answer to each sample,
  which is what the SFT warm start (``sft_warmup.source: fc_tasks``) trains on;
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

import palaestra.egpo.multiturn_data  # noqa: F401  (registers the `datagen_multi_turn` env)
from palaestra.egpo.eval import Decoder, PromptFormat
from palaestra.egpo.tasks import FCTask, load_bfcl, load_jsonl
from palaestra.shared.jobs import job
from palaestra.shared.rl.advantages import AdvantageStep
from palaestra.shared.rl.config import EnvSpec, EvalConfig, TaskSampling, TrainConfig
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.train import train_headline
from palaestra.shared.rollout.env import ENVS
from palaestra.shared.rollout.tasks import TASKS
from palaestra.shared.toolcall import ToolCall, format_calls
from palaestra.shared.tracking import Tracker

if TYPE_CHECKING:
    from palaestra.shared.rl.trainer import Trainer


@TASKS.register("fc_tasks")
def fc_tasks(
    path: str | None = None,
    bfcl_category: str | None = None,
    synthetic: int = 0,
    limit: int | None = None,
    with_answers: bool = False,
    seed: int = 0,
    compact_tools: bool = False,
    max_tools: int = 0,
    first_turn_only: bool = False,
    min_args: int = 0,
    think_args: bool = False,
) -> list[dict]:
    """Function-calling samples (``messages``, ``tools``, ``ground_truth``) for the ``task`` env and SFT.

    ``compact_tools``: list the tools as one short line each in the system prompt instead of the chat
    template's JSON block (about 400 tokens less per prompt; for tiny CPU runs). The reward then reads
    the schemas from ``tool_docs``.
    ``max_tools`` (0: all): offer at most this many tools per task: the ground truth's, then others of the
    task's list drawn at random (seeded per task); the prompt stays in the chat template's JSON format and
    shrinks from a whole environment's docs (1-3k tokens in datagen's output) to a few hundred tokens.
    ``first_turn_only``: of a multi-turn record, keep only the task of its first user turn (the later ones
    carry the whole conversation so far in their prompt).
    ``min_args``: keep only tasks whose every expected call passes at least this many arguments (tasks with
    no call are dropped too when > 0): SFT data that shows argument filling, not calls with 0 or 1 argument.
    ``think_args``: the reference thought of ``with_answers`` names the arguments each call fills
    ("Call f with a, b.") instead of the function only."""
    from palaestra.egpo.synthetic import synthetic_tasks

    tasks: list[FCTask] = []
    if path:
        tasks += [t for t in load_jsonl(path, limit) if not first_turn_only or _user_turns(t) == 1]
    if bfcl_category:
        tasks += load_bfcl(bfcl_category, limit)
    if synthetic:
        tasks += synthetic_tasks(synthetic, seed=seed)
    if not tasks:
        raise ValueError("fc_tasks: no tasks; set path (JSONL), bfcl_category or synthetic (a count)")
    if max_tools < 0:
        raise ValueError(f"fc_tasks: max_tools must be >= 0, got {max_tools}")
    if min_args < 0:
        raise ValueError(f"fc_tasks: min_args must be >= 0, got {min_args}")
    if min_args:
        tasks = [t for t in tasks if t.ground_truth and min(_given_args(t)) >= min_args]
        if not tasks:
            raise ValueError(f"fc_tasks: no task has calls with at least {min_args} arguments")
    if max_tools:
        tasks = [subset_tools(t, max_tools, seed) for t in tasks]
    return [task_sample(t, with_answers, compact_tools, think_args) for t in tasks]


def _given_args(task: FCTask) -> list[int]:
    """Arguments each call of the task's reference answer passes (`canonical_calls`)."""
    from palaestra.egpo.tasks import canonical_calls

    return [len(c["arguments"]) for c in canonical_calls(task.ground_truth, task.tools)]


def _user_turns(task: FCTask) -> int:
    return sum(m.get("role") == "user" for m in task.messages)


def subset_tools(task: FCTask, max_tools: int, seed: int = 0) -> FCTask:
    """`task` with its tools cut to the ground truth's plus random others, `max_tools` in all (at least the
    ground truth's)."""
    import dataclasses
    import random

    from palaestra.egpo.tasks import tool_doc

    needed = {name for call in task.ground_truth for name in call}
    keep = [t for t in task.tools if tool_doc(t).get("name") in needed]
    others = [t for t in task.tools if tool_doc(t).get("name") not in needed]
    random.Random(f"{seed}:{task.id}").shuffle(others)
    keep += others[: max(0, max_tools - len(keep))]
    order = {id(t): i for i, t in enumerate(task.tools)}
    return dataclasses.replace(task, tools=sorted(keep, key=lambda t: order[id(t)]))


def compact_signature(tool: dict) -> str:
    """``name(param: type, ...)`` of a tool."""
    doc = tool.get("function", tool)
    props = (doc.get("parameters") or {}).get("properties") or {}
    params = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in props.items())
    return f"{doc['name']}({params})"


def task_sample(
    task: FCTask, with_answer: bool = False, compact_tools: bool = False, think_args: bool = False
) -> dict[str, Any]:
    from palaestra.egpo.synthetic import reference_thinking
    from palaestra.egpo.tasks import canonical_calls

    messages = task.prompt_messages()
    if with_answer:
        calls = [ToolCall(c["name"], c["arguments"]) for c in canonical_calls(task.ground_truth, task.tools)]
        content = "I cannot help with that using these tools." if not calls else ""
        text = format_calls(calls, thinking=reference_thinking(task, think_args), content=content)
        messages = [*messages, {"role": "assistant", "content": text}]
    sample = {
        "id": task.id,
        "messages": messages,
        "tools": task.chat_tools(),
        "ground_truth": task.ground_truth,
        "category": task.category,
    }
    if compact_tools:
        listing = "Tools: " + "; ".join(compact_signature(t) for t in task.tools)
        system = {"role": "system", "content": f"{messages[0]['content']}\n{listing}"}
        sample.update(messages=[system, *messages[1:]], tools=None, tool_docs=sample["tools"])
    return sample


@ENVS.register("bfcl_multi_turn")
def bfcl_multi_turn(category: str = "multi_turn_base", limit: int | None = None):
    """BFCL multi-turn entries of `category`; ``reset(seed)`` plays entry ``seed % count``."""
    from palaestra.egpo.bfcl import load_category
    from palaestra.egpo.multiturn import BFCLMultiTurnEnv

    pairs = load_category(category, limit)

    class _Env(BFCLMultiTurnEnv):
        env_type = f"bfcl_{category}"
        num_tasks = len(pairs)  # for task_sampling: epochs (palaestra.shared.rl.task_sampling)

        def reset(self, seed: int | None = None) -> dict[str, Any]:
            self.entry, self.ground_truth = pairs[(seed or 0) % len(pairs)]
            return super().reset(seed)

    return _Env(*pairs[0])


def _egpo_advantages() -> list[AdvantageStep]:
    return [AdvantageStep("grpo"), AdvantageStep("entropy_clipped", {"lam": 0.4, "alpha": 2.0})]


@dataclass
class EvalAfterConfig(EvalConfig):
    """A BFCL evaluation of the trained policy at the end of training (same MLflow run). The sampling fields are
    `EvalConfig`'s (unset: the training rollout's), used by the default evaluation (``eval_tasks``); BFCL reads
    ``max_tokens_per_turn`` and ``max_context_tokens`` from them and decodes greedily (its protocol)."""

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
    """palaestra | bfcl (BFCL's Qwen FC decoder; `BfclEvalConfig.decoder`)."""


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
    artifact ``data/contamination.json`` (`palaestra.egpo.bfcl_contamination.check_training_sets`)."""


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
            max_tokens_per_turn=cfg.eval.max_tokens_per_turn,
            max_context_tokens=cfg.eval.max_context_tokens,
            max_model_calls=cfg.eval.max_model_calls,
            prompt=cfg.eval.prompt,
            decoder=cfg.eval.decoder,
            seed=cfg.seed,
            output_dir=f"{cfg.output_dir}/eval",
        )
        # on the trainer's rollout workers (vLLM where workers.llm says so), holding the weights of that checkpoint
        self.result = evaluate_with_client(eval_cfg, trainer.client, self.tracker, trainer.eval_rollouts())
        return {**metrics, **{k: v for k, v in self.result.items() if isinstance(v, int | float)}}


def log_contamination(cfg: EGPOTrainConfig, tracker: Tracker) -> dict[str, Any]:
    """BFCL's contamination check of every training set (`check_training_sets`), logged in the run: the artifact
    ``data/contamination.json``, metrics ``data/<set>/contaminated`` and ``/checked``, and one line per set."""
    from palaestra.egpo.bfcl_contamination import check_training_sets

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

    if cfg.contamination_check:
        log_contamination(cfg, tracker)
    bfcl = BfclAtEnd(cfg, tracker) if cfg.eval.categories else None
    with Trainer(cfg, tracker, eval_hook=bfcl) as trainer:
        if cfg.task_sampling == TaskSampling.epochs and cfg.epochs:
            steps, tasks = trainer.total_steps, trainer.tasks.num_tasks
            tracker.log_params({"derived.steps": steps, "derived.num_tasks": tasks})
            print(f"egpo.train: {cfg.epochs} epochs over {tasks} tasks = {steps} steps", flush=True)
        trainer.prepare()  # resume or SFT warm start, reference model, rollout workers
        out = trainer.train()
    if bfcl is not None:
        out.update(bfcl.result)
    out.setdefault("headline", train_headline(out))  # the BFCL accuracy when evaluated, else the training reward
    return out
