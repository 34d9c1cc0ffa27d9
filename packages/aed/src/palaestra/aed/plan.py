"""The CPU budget and Ray placement of an ``aed.attack`` or ``aed.victim`` config, before anything runs.

``palaestra plan experiments/aed/paper.yaml [key=value ...]`` resolves the config (a pipeline's ``aed.victim``
and ``aed.attack`` stages too) and prints, per task (scenario, type, arm, baselines), the environment steps it
takes and its CPU-hours at `SECONDS_PER_STEP`, then how the tasks sit on the Ray cluster. These plans reach the
shared ``palaestra plan`` through its registry `palaestra.shared.plan.JOB_PLANS` (aed/plugins.py).

Steps of one attack task (upper bounds: episodes may end before ``max_steps``):

- training: ``train.timesteps``;
- an LLM arm (``rewards: llm``, the llm arm of ``both``, every LLM-proposed type): Eureka's candidates,
  ``eureka.rounds x eureka.samples x (eureka.timesteps + eureka.eval_episodes x max_steps)``;
- preference learning: ``preference.finetune_timesteps`` plus a second evaluation;
- evaluation ``eval_episodes x max_steps`` and video ``video_episodes x max_steps``.

A baseline task evaluates only; an ``aed.victim`` stage trains ``timesteps``; an ``aed.qualify`` stage runs
``episodes x max_steps`` per scenario. The number of LLM-proposed types is known only once the LLM has answered:
the plan counts ``proposals.n_types`` per scenario (the most kept).

LLM requests (`llm_plan`): per LLM arm, Eureka's ``rounds x samples`` generations (one request each); per
scenario ``1 + proposals.retries`` proposal requests; with ``preference.judge: llm`` up to ``max_pairs``
comparisons per attack task (its labels, one per accident, are not known before the run). Generated tokens are
bounded by each request's ``max_tokens``; prompt tokens are estimated from the prompts' own text at
`CHARS_PER_TOKEN` (from round 2 on a Eureka prompt also holds the last answer and its feedback).
"""

from __future__ import annotations

import math
from typing import Any

from palaestra.shared.plan import JobPlan

CHARS_PER_TOKEN = 4
"""A rough size of a token of English and code, for prompt estimates (no tokenizer at plan time)."""
SECONDS_PER_STEP = 0.05
"""CPU-seconds per environment step, simulation and SB3 learner together (highway-env runs about 50 steps/s in
one process here, before any learner update: DESIGN.md section 3)."""


def task_steps(cfg, task: dict[str, Any]) -> int:
    """Environment steps of one task of `cfg` (module docstring)."""
    from palaestra.aed.scenarios import get_scenario

    horizon = cfg.max_steps or get_scenario(task["scenario"]).max_steps
    evaluation = cfg.eval_episodes * horizon
    if task["kind"] != "attack":
        return evaluation
    steps = cfg.train.timesteps + evaluation
    if _is_llm(cfg, task):
        e = cfg.eureka
        steps += e.rounds * e.samples * (e.timesteps + e.eval_episodes * horizon)
    if cfg.preference.enabled:
        steps += cfg.preference.finetune_timesteps + evaluation
    if cfg.video:
        steps += cfg.video_episodes * horizon
    return steps


def attack_plan(cfg) -> tuple[list[str], float]:
    """Lines of the plan of an ``aed.attack`` config, and its total CPU-hours."""
    from palaestra.aed.attack import attack_tasks

    proposed = None
    if cfg.taxonomy in ("llm", "both"):  # placeholders for the types the LLM will propose
        n = cfg.proposals.n_types
        fake = [{"name": f"proposed_{i + 1}", "recognizer": "(LLM-written)"} for i in range(n)]
        proposed = {s: fake for s in cfg.scenarios}
    tasks = attack_tasks(cfg, proposed, check_victim=False)
    lines = ["| task | env steps | CPU-hours |", "| --- | --- | --- |"]
    total = 0.0
    per_type: dict[str, float] = {}
    for task in tasks:
        steps = task_steps(cfg, task)
        hours = steps * SECONDS_PER_STEP / 3600
        total += hours
        lines.append(f"| {task['name']} | {steps:,} | {hours:.2f} |")
        if task["kind"] == "attack":
            key = f"{task['scenario']}/{task['accident_type']}"
            per_type[key] = per_type.get(key, 0.0) + hours
    lines.append("")
    lines += [f"per type (all arms): {k} {v:.1f} CPU-hours" for k, v in per_type.items()]
    cpus = cfg.cpus_per_task
    slots = int(cfg.cluster.num_cpus // cpus) if cfg.cluster.num_cpus else None
    longest = max(task_steps(cfg, t) for t in tasks) * SECONDS_PER_STEP / 3600
    lines.append(
        f"Ray: {len(tasks)} tasks (one per scenario, type and arm, plus baselines), each asking {cpus:g} CPUs "
        f"({cfg.train.n_envs} vectorized envs): {len(tasks) * cpus:g} CPUs run them all at once"
        + (f"; this cluster's {cfg.cluster.num_cpus} CPUs hold {slots} at a time" if slots else "")
        + f" (cluster address: {cfg.cluster.address or 'local'})."
    )
    waves = math.ceil(len(tasks) / slots) if slots else 1
    wall = waves * longest / max(1.0, min(cpus, cfg.train.n_envs))
    lines.append(
        f"Longest task {longest:.1f} CPU-hours; about {wall:.1f} hours of wall time in {waves} wave(s) if its "
        f"envs use its {cpus:g} CPUs. Total {total:.1f} CPU-hours at {SECONDS_PER_STEP * 1000:.0f} ms per step."
    )
    return lines + llm_plan(cfg, tasks), total


def llm_plan(cfg, tasks: list[dict[str, Any]]) -> list[str]:
    """Lines counting the run's LLM requests and tokens (module docstring); none without an LLM arm."""
    from palaestra.aed.prompts import FEEDBACK_OK, SYSTEM, task_prompt

    designs = [t for t in tasks if t["kind"] == "attack" and _is_llm(cfg, t)]
    e, p = cfg.eureka, cfg.proposals
    eureka = len(designs) * e.rounds * e.samples
    proposals = len(cfg.scenarios) * (1 + p.retries) if cfg.taxonomy in ("llm", "both") else 0
    judged = sum(t["kind"] == "attack" for t in tasks) if cfg.preference.enabled else 0
    judge = judged * cfg.preference.max_pairs if cfg.preference.judge == "llm" else 0
    if not eureka + proposals + judge:
        return []
    prompt = 0
    for t in designs:
        first = (len(SYSTEM) + len(task_prompt(t["accident_type"], t["scenario"]))) // CHARS_PER_TOKEN
        later = first + e.max_tokens + len(FEEDBACK_OK) // CHARS_PER_TOKEN
        prompt += e.samples * (first + (e.rounds - 1) * later)
    generated = eureka * e.max_tokens + proposals * p.max_tokens + judge * cfg.preference.judge_max_tokens
    return [
        f"LLM ({cfg.llm.backend} {cfg.llm.model}): {eureka + proposals + judge:,} requests: Eureka {eureka:,} "
        f"({len(designs)} LLM-arm tasks x {e.rounds} rounds x {e.samples} samples), proposals {proposals}, "
        f"judge comparisons {judge:,} (labels not counted); at most {generated:,} generated tokens; Eureka "
        f"prompts about {prompt:,} tokens ({CHARS_PER_TOKEN} characters per token)."
    ]


def _is_llm(cfg, task: dict[str, Any]) -> bool:
    return task.get("arm") in ("llm", "proposed") or (task.get("arm") is None and cfg.rewards == "llm")


def attack_job_plan(cfg) -> JobPlan:
    """`JOB_PLANS` entry of ``aed.attack``: the task table, CPU-hours per type and the Ray placement."""
    from palaestra.shared.plan_layout import served_plan_lines

    lines, hours = attack_plan(cfg)
    lines += served_plan_lines(cfg.llm)  # the reward designer's and judge's one-GPU layout
    return JobPlan("\n".join(lines), cpu_hours=hours)


def victim_job_plan(cfg) -> JobPlan:
    """`JOB_PLANS` entry of ``aed.victim``: its training steps and CPU-hours."""
    hours = cfg.timesteps * SECONDS_PER_STEP / 3600
    return JobPlan(f"aed.victim {cfg.scenario}: {cfg.timesteps:,} steps, {hours:.2f} CPU-hours", cpu_hours=hours)


def qualify_job_plan(cfg) -> JobPlan:
    """`JOB_PLANS` entry of ``aed.qualify``: its passive episodes per scenario and CPU-hours."""
    from palaestra.aed.scenarios import get_scenario

    steps = sum(cfg.episodes * (cfg.max_steps or get_scenario(s).max_steps) for s in cfg.scenarios)
    hours = steps * SECONDS_PER_STEP / 3600
    names = ", ".join(cfg.scenarios)
    text = f"aed.qualify {names}: {cfg.episodes} passive episodes each, {steps:,} steps, {hours:.2f} CPU-hours"
    return JobPlan(text, cpu_hours=hours)
