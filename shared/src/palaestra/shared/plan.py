"""`palaestra plan CONFIG`: will an RL training config fit its GPUs? A per-device memory estimate, and how long its
evaluations take, before launch.

The model's architecture comes from its config without downloading weights (plan_memory.py `model_arch`).
The memory model is in plan_memory.py.

Evaluation time: the shared core cannot know a package's evaluation, so a package registers an estimator
for its job in `EVAL_COSTS` (keyed by job name; entry-point group ``palaestra.eval_costs``): ``fn(cfg, cpus)
-> EvalCost``, one evaluation's seconds and the lines that say how they were counted (mars: ``mars.train``,
`palaestra.mars.eval_cost`). The plan multiplies it by the run's evaluations (`evaluations`: before training
when ``eval_before``, every ``eval_every`` steps and at the end, as `Trainer.train` runs them); a job with no
estimator gets a line saying so. ``cpus``: the Ray cluster's CPUs (``cluster.num_cpus``, else ``--cpus``), for
CPU-bound evaluation work such as game-tree search.

Other jobs: a config that is not RL training (AED's CPU-bound attack, its victim) plans through `JOB_PLANS`
(keyed by job name; entry-point group ``palaestra.job_plans``): ``fn(cfg) -> JobPlan``, its report, whether it
fits and its CPU-hours where it counts them (aed: ``aed.attack``, ``aed.victim``, `palaestra.aed.plan`). A
pipeline is planned stage by stage (`plan_config`), with the CPU-hours of its stages summed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from palaestra.shared.plan_layout import layout_lines
from palaestra.shared.plan_memory import (
    GB,
    RUNTIME_RESERVE_GB,
    engine_tokens,
    learner_memory,
    learner_shape,
    learner_total,
    model_arch,
    policies_memory,
    reference_bytes,
    trainer_weight_bytes,
    vllm_memory,
)
from palaestra.shared.registry import Registry
from palaestra.shared.rl.layout import LAYOUTS, Layout


@dataclass
class EvalCost:
    """One evaluation's estimated wall time, and the lines that say how it was counted."""

    seconds: float
    lines: list[str] = field(default_factory=list)


EvalCostFn = Callable[[Any, int], EvalCost]
EVAL_COSTS: Registry[EvalCostFn] = Registry("evaluation cost estimator", "palaestra.eval_costs")
"""Job name -> ``fn(cfg, cpus) -> EvalCost`` (one evaluation of that job's config)."""


def evaluations(cfg) -> int:
    """How many evaluations `Trainer.train` runs over ``steps``: before (``eval_before``), at every multiple of
    ``eval_every`` short of the last step, and at the end."""
    every = cfg.eval_every
    return int(bool(cfg.eval_before)) + ((cfg.steps - 1) // every if every and cfg.steps > 0 else 0) + 1


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def eval_lines(cfg, cpus: int) -> list[str]:
    """The evaluation-time lines of the plan: the job's estimator (`EVAL_COSTS`) times `evaluations`."""
    if cfg.job not in EVAL_COSTS:
        return [f"evaluation time: not estimated (job {cfg.job} registers no estimator in plan.EVAL_COSTS)"]
    cost = EVAL_COSTS.get(cfg.job)(cfg, cpus)
    n = evaluations(cfg)
    return [
        *cost.lines,
        f"evaluation time: {_duration(cost.seconds)} per evaluation x {n} evaluations = {_duration(n * cost.seconds)}",
    ]


def plan(cfg, gpu_gb: float = 80.0, gpus: int = 8, cpus: int = 64) -> tuple[str, bool]:
    """The report for an RL `TrainConfig` on `gpus` GPUs of `gpu_gb` GB, and whether it fits (`cpus`: the Ray
    cluster's CPUs when ``cluster.num_cpus`` is unset, for the evaluation-time estimate)."""
    if len(cfg.policies) == 1:  # one declared policy: its own model and settings
        from palaestra.shared.rl.policy_configs import policy_config

        cfg = policy_config(cfg, next(iter(cfg.policies)))
    arch, source = model_arch(cfg.llm.model)
    learner, world = cfg.learner, cfg.learner.world_size
    on_gpu = learner.num_gpus > 0 if world > 1 else cfg.llm.device != "cpu"
    dtype = learner.compute_dtype if learner.compute_dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    compute = 4 if dtype == "float32" else 2
    master = 4  # the learner's weights stay float32 (rl/config.py)
    longest = cfg.rollout.max_context_tokens
    per_rank_rows = math.ceil((cfg.minibatch_size or cfg.tasks_per_step * cfg.rollout.group_size) / world)
    budget = learner.micro_batch_tokens
    shape = learner_shape(cfg, compute, master)
    tokens = shape.micro_batch_tokens
    parts = learner_memory(arch, shape, on_gpu)
    several = policies_memory(cfg, parts, on_gpu, compute, master, gpu_gb)
    total = learner_total(parts) + several.extra
    g = lambda b: f"{b / GB:8.2f}"  # noqa: E731
    if world == 1:
        layout = "1 process (the trainer's own), whole model"
    else:
        shard = f"sharded 1/{world}" if learner.strategy == "fsdp" else "replicated"
        layout = f"{world} ranks x {learner.num_gpus:g} GPU, {learner.strategy} ({shard})"
    ckpt = "on" if shape.gradient_checkpointing else "off"
    lines = [
        f"model {cfg.llm.model}: {arch.params() / 1e9:.3f}B parameters ({source})",
        f"learner: {layout}; {dtype} compute, {'fp32' if master == 4 else dtype} weights",
        f"micro-batch: {tokens} tokens ({'learner.micro_batch_tokens' if budget else f'{per_rank_rows} rows'}; "
        f"longest row {longest}), gradient checkpointing {ckpt}",
        f"per learner {'GPU' if on_gpu else 'process (CPU memory)'} (GB, of {gpu_gb:g}):",
        f"  weights                  {g(parts['weights'])}",
        f"  gradients                {g(parts['gradients'])}",
        f"  optimizer (AdamW)        {g(parts['optimizer'])}"
        + (offloaded(arch.params()) if shape.optimizer_offload else ""),
        f"  gathered / cast weights  {g(parts['gathered'])}",
        f"  output-layer gradient    {g(parts['output_grad'])}",
        f"  reference model ({'fp32' if reference_bytes(shape) == 4 else 'bf16'})   {g(parts['reference'])}",
        f"  activations ({ckpt:>3})     {g(parts['activations'])}"
        f"   (checkpointing on: {parts['activations_ckpt'] / GB:.2f}, off: {parts['activations_no_ckpt'] / GB:.2f})",
        f"  attention mask           {g(parts['attention_mask'])}",
        f"  logits                   {g(parts['logits'])}",
        f"  runtime reserve          {g(parts['reserve'])}",
        *several.lines,
        f"  total                    {g(total)}  {'fits' if total <= gpu_gb * GB else 'DOES NOT FIT'}",
    ]
    fits = total <= gpu_gb * GB and several.fits
    learner_gpus = math.ceil(world * learner.num_gpus) if world > 1 else (1 if on_gpu else 0)
    if several.learner_gpus is not None:
        learner_gpus = several.learner_gpus
    driver_gpus = 1 if world > 1 and cfg.llm.device != "cpu" else 0
    if driver_gpus and several.driver_bytes is not None:  # every policy's copy (and in-process learners)
        driver = several.driver_bytes + RUNTIME_RESERVE_GB * GB
        ok = driver <= gpu_gb * GB
        lines.append(
            f"trainer process GPU ({cfg.llm.device}): the policies' float32 copies (with a reference: its copy too "
            f"while they start) and in-process learners {several.driver_bytes / GB:.2f} "
            f"+ reserve {RUNTIME_RESERVE_GB:g} = {driver / GB:.2f} GB  {'fits' if ok else 'DOES NOT FIT'}"
        )
        fits = fits and ok
    elif driver_gpus:  # the trainer's own copy of the weights (rollouts, evaluation, checkpoints)
        trainer_bytes = trainer_weight_bytes(arch.params(), shape.reference_model, compute)
        driver = trainer_bytes + RUNTIME_RESERVE_GB * GB
        ok = driver <= gpu_gb * GB
        ref = f" and the {'bf16' if compute == 2 else 'float32'} reference it saves" if shape.reference_model else ""
        lines.append(
            f"trainer process GPU ({cfg.llm.device}): its float32 model{ref} "
            f"{trainer_bytes / GB:.2f} + reserve {RUNTIME_RESERVE_GB:g} = {driver / GB:.2f} GB  "
            f"{'fits' if ok else 'DOES NOT FIT'}"
        )
        fits = fits and ok
    w = cfg.workers
    worker_llm = w.llm or cfg.llm
    worker_gpus = 0
    colocated = cfg.layout != Layout.custom and LAYOUTS[Layout(cfg.layout)].colocated
    if colocated:  # the engines share the learner's GPUs: the layout section counts them
        pass
    elif w.num_workers and worker_llm.backend == "vllm":
        tp = worker_llm.tensor_parallel_size
        v = vllm_memory(arch, gpu_gb, worker_llm.gpu_memory_utilization, tp)
        worker_gpus = w.num_workers * max(math.ceil(w.num_gpus), tp)
        need = engine_tokens(arch, cfg)
        ok = v["kv_tokens"] >= need
        lines.append(
            f"per vLLM device ({w.num_workers} worker(s) x {tp} GPU, gpu_memory_utilization "
            f"{worker_llm.gpu_memory_utilization:g}): budget {v['budget'] / GB:.2f}, weights {v['weights'] / GB:.2f}, "
            f"KV cache {v['kv_cache'] / GB:.2f} GB = {v['kv_tokens'] / 1e3:.0f}k tokens "
            f"({v['kv_tokens'] / cfg.rollout.max_context_tokens:.1f} sequences of {cfg.rollout.max_context_tokens}; "
            f"vLLM starts with one of the model's {need})  "
            f"{'fits' if ok else f'DOES NOT FIT (fewer than the {need} tokens of one max_model_len sequence)'}"
        )
        fits = fits and ok
    elif w.num_workers:
        worker_gpus = math.ceil(w.num_workers * w.num_gpus)
    used = learner_gpus + worker_gpus + driver_gpus
    trainer = f" + {driver_gpus} trainer process" if driver_gpus else ""
    if colocated:
        used = LAYOUTS[Layout(cfg.layout)].gpus
        lines.append(f"GPUs: {used} learner + vLLM colocated (each holds both) = {used} of {gpus}")
    else:
        lines.append(f"GPUs: {learner_gpus} learner + {worker_gpus} rollout{trainer} = {used} of {gpus}")
    if cfg.layout != Layout.custom:
        trainer_held = 0.0 if not driver_gpus or several.driver_bytes is not None else trainer_bytes
        section, ok = layout_lines(cfg, arch, learner_parts_for_layout(parts, several), trainer_held, gpu_gb)
        lines += section
        fits = fits and ok
    if used > gpus:
        fits = False
        lines.append(f"  DOES NOT FIT: the config asks for {used} GPUs")
    lines += eval_lines(cfg, cfg.cluster.num_cpus or cpus)
    lines.append(f"plan: {'fits' if fits else 'does not fit'}")
    return "\n".join(lines), fits


def offloaded(params: int) -> str:
    """The optimizer line's note with ``learner.optimizer_offload`` (rl/optim_offload.py): what host memory holds."""
    return f"   (in CPU memory: moments and scratch weights and gradients, {16 * params / GB:.2f} GB of host RAM)"


def learner_parts_for_layout(parts: dict[str, float], several) -> dict[str, float]:
    """One learner device's parts, with several policies' extra bytes counted among its activations' (the
    layout section's total is the same as the plan's)."""
    return parts if not several.extra else {**parts, "activations": parts["activations"] + several.extra}


@dataclass
class JobPlan:
    """The plan of one job's config: its report, whether it fits, and its CPU-hours where the job counts them."""

    text: str
    fits: bool = True
    cpu_hours: float | None = None


JobPlanFn = Callable[[Any], JobPlan]
JOB_PLANS: Registry[JobPlanFn] = Registry("job plan", "palaestra.job_plans")
"""Job name -> ``fn(cfg) -> JobPlan``, for jobs whose configs are not RL training configs."""


def plan_config(cfg, gpu_gb: float = 80.0, gpus: int = 8, cpus: int = 64) -> tuple[str, bool]:
    """The report of any plannable config and whether it fits: an RL `TrainConfig` (`plan`), a job registered in
    `JOB_PLANS`, or a pipeline, stage by stage. A config with nothing to plan is a `ValueError`."""
    from palaestra.shared.pipeline import PipelineConfig, stage_configs
    from palaestra.shared.rl.config import TrainConfig

    if isinstance(cfg, TrainConfig):
        return plan(cfg, gpu_gb=gpu_gb, gpus=gpus, cpus=cpus)
    if cfg.job in JOB_PLANS:
        p = JOB_PLANS.get(cfg.job)(cfg)
        return p.text, p.fits
    if not isinstance(cfg, PipelineConfig):
        raise ValueError(f"plan needs an RL training config or a job in plan.JOB_PLANS (job {cfg.job} is not one)")
    out, fits, hours, planned = [], True, 0.0, 0
    for name, stage in stage_configs(cfg).items():
        if isinstance(stage, TrainConfig):
            text, ok = plan(stage, gpu_gb=gpu_gb, gpus=gpus, cpus=cpus)
        elif stage.job in JOB_PLANS:
            p = JOB_PLANS.get(stage.job)(stage)
            text, ok, hours = p.text, p.fits, hours + (p.cpu_hours or 0.0)
        else:
            out.append(f"stage {name} ({stage.job}): nothing to plan")
            continue
        planned += 1
        out += [f"stage {name} ({stage.job}):", text]
        fits = fits and ok
    if not planned:
        raise ValueError("plan: no stage of this pipeline is an RL training config or a job in plan.JOB_PLANS")
    if hours:
        out.append(f"all stages: {hours:.1f} CPU-hours")
    out.append(f"pipeline plan: {'fits' if fits else 'does not fit'}")
    return "\n".join(out), fits
