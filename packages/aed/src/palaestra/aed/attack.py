"""The ``aed.attack`` job: one adversarial policy per (scenario, accident type), trained in parallel as Ray tasks
(`palaestra.aed.attack_task`), each in its own MLflow child run; plus random and passive adversary baselines
measured in the same run. A task whose worker dies is retried by Ray; a type that fails is reported and the
others are kept. Its config (`AttackConfig`) and the tasks it runs (`attack_tasks`, also planned by
`palaestra.aed.plan`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from palaestra.aed.adversary import TrainSettings
from palaestra.aed.scenarios import AdversaryPlacement
from palaestra.shared.config import ConfigError, JobConfig, value_check
from palaestra.shared.jobs import job
from palaestra.shared.llm.base import LLMConfig
from palaestra.shared.tracking import Tracker


class JudgeKind(StrEnum):
    """Who labels accidents and compares pairs for preference learning."""

    rules = "rules"
    llm = "llm"


class TaxonomySource(StrEnum):
    """Where the accident types come from (``both``: the fixed types, and the LLM-proposed ones beside them)."""

    expert = "expert"
    llm = "llm"
    both = "both"


class VictimKind(StrEnum):
    """The AV under test: the rule-based IDM or a frozen RL policy."""

    idm = "idm"
    rl = "rl"


class RewardSource(StrEnum):
    """Who writes the adversaries' rewards (``both``: the paper's comparison of the two)."""

    expert = "expert"
    llm = "llm"
    both = "both"


def check_scenarios(value: list[str] | str, owner: Any) -> str | None:
    """Every name is a scenario of palaestra.aed.scenarios (with did-you-mean)."""
    from palaestra.aed.scenarios import get_scenario

    for name in [value] if isinstance(value, str) else value:
        try:
            get_scenario(name)
        except ValueError as err:
            return str(err)
    return None


def check_accident_types(value: list[str], owner: Any) -> str | None:
    """Every accident type has an expert reward (palaestra.aed.rewards)."""
    from palaestra.aed.rewards import EXPERT_REWARDS

    unknown = [t for t in value if t not in EXPERT_REWARDS]
    return f"unknown accident type {unknown[0]!r} (known: {', '.join(EXPERT_REWARDS)})" if unknown else None


@dataclass
class EurekaConfig:
    rounds: int = 3
    """Feedback rounds of LLM reward design."""
    samples: int = 2
    """Reward candidates the LLM writes per round."""
    timesteps: int = 1000
    """Training steps per candidate (a short run, as in Eureka)."""
    eval_episodes: int = 5
    """Evaluation episodes per candidate (its fitness)."""
    temperature: float = 0.8
    max_tokens: int = 768


@dataclass
class PreferenceConfig:
    enabled: bool = False
    """Fit a Bradley-Terry model on judge-labelled accidents and fine-tune the adversary with it."""
    judge: JudgeKind = JudgeKind.rules
    """rules (the graded rule score) | llm (through ``llm``): who compares the pairs and labels the accidents."""
    finetune_timesteps: int = 1000
    effective_bonus: float = 10.0
    """Extra reward during fine-tuning for an accident the model scores effective."""
    ineffective_penalty: float = 1.0
    """Penalty during fine-tuning for an accident the model scores ineffective (0: it only earns nothing)."""
    responsibility_shaping: float = 0.5
    """Weight of the dense preference reward during fine-tuning: at every step near the victim, the model's
    verdict (tanh of score minus threshold) on the contact that would happen now; 0: accidents only."""
    restart_exploration: float = 0.0
    """> 0: DQN fine-tuning starts from this epsilon with an empty replay buffer; 0: continue the pre-training
    schedule and buffer. (Measured on tiny_cpu: a restart at 0.3 collapses the attack to ~0.04 ASR.)"""
    relabel_buffer: bool = False
    """DQN: rewrite the reward of the pre-training accidents still in the replay buffer under the preference
    filter (bonus / penalty) before fine-tuning, so that old transitions stop paying for ineffective accidents
    (see `palaestra.aed.preference.relabel_replay`; measured effect in the package README)."""
    epochs: int = 200
    """Bradley-Terry fitting epochs."""
    max_pairs: int = 2000
    """Pairs of accidents the judge compares (which one is the AV more responsible for)."""
    holdout: float = 0.25
    """Share of the accidents held out: the model's pair accuracy is reported on pairs among them."""
    min_accidents: int = 6
    """Fewer accidents than this (or only one kind): preference learning is skipped and said so."""
    judge_max_tokens: int = 256
    """Tokens the LLM judge may answer per comparison or label (``judge: llm``)."""


@dataclass
class ProposalConfig:
    n_types: int = 4
    """Accident types the LLM is asked for per scenario (one adversary is trained per usable type)."""
    temperature: float = 0.7
    max_tokens: int = 1536
    retries: int = 1
    """Further answers the LLM gets after its refused proposals are fed back (each refusal with its reason)."""


@dataclass
class AttackConfig(JobConfig):
    job: str = "aed.attack"
    scenarios: list[str] = field(
        default_factory=lambda: ["highway"], metadata=value_check("palaestra.aed.attack:check_scenarios")
    )
    """highway | merge | roundabout | intersection (palaestra.aed.scenarios)."""
    accident_types: list[str] = field(
        default_factory=list, metadata=value_check("palaestra.aed.attack:check_accident_types")
    )
    """Accident types to attack (one policy each); empty: each scenario's defaults (rewards.SCENARIO_TYPES).
    Ignored with taxonomy=llm."""
    taxonomy: TaxonomySource = TaxonomySource.expert
    """expert (the fixed taxonomy) | llm (per scenario the LLM proposes types with recognizers, through ``llm``;
    the fixed taxonomy when its answer is unusable) | both (the fixed types with the arms of ``rewards``, and beside
    them the usable LLM-proposed types, arm ``proposed``: LLM reward only, since no expert reward exists for a new
    type; each is compared with the random adversary's rate of that type under the proposed recognizers, on the
    same episodes, and through the per-arm diversity metrics). A type without an expert reward gets an LLM reward."""
    proposals: ProposalConfig = field(default_factory=ProposalConfig)
    victim: VictimKind = VictimKind.idm
    """idm (rule-based) | rl (a frozen SB3 policy from victim_checkpoint)."""
    victim_checkpoint: str | None = None
    """SB3 .zip written by the aed.victim job (victim=rl); ``{scenario}`` in it is replaced by each scenario's name
    (one victim per scenario, e.g. ``outputs/victims/{scenario}_dqn.zip``)."""
    num_adversaries: int = 1
    """NPCs nearest to the victim taken over after each reset (more than one needs train.algo=ppo)."""
    adversary_placement: AdversaryPlacement = AdversaryPlacement.nearest
    """nearest (the NPCs nearest the victim) | scenario (the scenario's own first, moved beside the victim: in
    merge the ramp car, which otherwise starts 80 m ahead and almost never meets the victim at the merge)."""
    env_overrides: dict[str, Any] = field(default_factory=dict)
    """highway-env config keys (e.g. vehicles_count) applied to every scenario."""
    max_steps: int | None = None
    """Policy steps per episode (default: the scenario's)."""
    rewards: RewardSource = RewardSource.expert
    """expert | llm (Eureka-style design through ``llm``, falling back to expert when every round fails) | both
    (the paper's comparison: each type trained once on each, same seeds; a table and a figure)."""
    llm: LLMConfig = field(default_factory=LLMConfig)
    eureka: EurekaConfig = field(default_factory=EurekaConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    train: TrainSettings = field(default_factory=TrainSettings)
    eval_episodes: int = 20
    """Evaluation episodes per policy (and for the random baseline)."""
    log_every: int = 500
    """Timesteps between two points of the learning curves."""
    random_baseline: bool = True
    """Also measure a uniformly random adversary in the same run."""
    passive_baseline: bool = False
    """Also measure passive adversaries (always IDLE: keep lane and speed): the accidents the victim has on its
    own in this traffic, the control for an attack's responsible accidents."""
    video: bool = True
    """Log a GIF of a sample accident per type."""
    video_episodes: int = 4
    """Episodes tried to catch an accident on video."""
    cpus_per_task: float = 1.0
    max_retries: int = 2
    """Ray retries of a task whose worker died."""
    require_qualified_victim: bool = True
    """Refuse a victim without a passing ``aed.qualify`` record for this traffic (its accident rate alone at most
    0.05: otherwise every attack rate is the victim's own crashes); false: attack it anyway, said in the log."""


def attack_tasks(
    cfg: AttackConfig, proposed: dict[str, list[dict]] | None = None, check_victim: bool = True
) -> list[dict[str, Any]]:
    """One task per (scenario, type, arm) and per baseline; ``proposed``: each scenario's LLM-proposed types.

    With ``taxonomy: both`` the proposed types (those with a recognizer) come beside the fixed ones, under arm
    ``proposed``, with their own random and passive baselines (classified by the proposed recognizers)."""
    from palaestra.aed.attack_task import victim_checkpoint
    from palaestra.aed.rewards import SCENARIO_TYPES

    tasks = []
    for scenario in cfg.scenarios:
        path = victim_checkpoint(cfg, scenario)
        if check_victim and cfg.victim == "rl" and not (path and Path(path).exists()):
            raise ConfigError(f"victim=rl needs an existing 'victim_checkpoint' (got {path!r}); run aed.victim")
        taxonomy = (proposed or {}).get(scenario)
        arms: list[str | None] = ["expert", "llm"] if cfg.rewards == "both" else [None]
        sets: list[tuple[list[dict] | None, list[str], list[str | None], str]]
        if cfg.taxonomy == "llm" and taxonomy:
            sets = [(taxonomy, [t["name"] for t in taxonomy], arms, "")]
        else:
            sets = [(None, list(cfg.accident_types or SCENARIO_TYPES[scenario]), arms, "")]
        new = [t for t in taxonomy or [] if t.get("recognizer")]
        if cfg.taxonomy == "both" and new:
            sets.append((new, [t["name"] for t in new], ["proposed"], "proposed"))
        for tax, names, set_arms, group in sets:
            common = {"scenario": scenario, "taxonomy": tax}
            for t in names:
                for arm in set_arms:
                    name = f"{scenario}/{t}" + (f"/{arm}" if arm else "")
                    tasks.append({"kind": "attack", "accident_type": t, "name": name, "arm": arm, **common})
            suffix = f"/{group}" if group else ""
            for kind in ("random", "passive"):
                if getattr(cfg, f"{kind}_baseline"):
                    tasks.append({"kind": kind, "name": f"{scenario}/{kind}{suffix}", "arm": group or None, **common})
    return tasks


@job("aed.attack", AttackConfig)
def attack(cfg: AttackConfig, tracker: Tracker) -> dict:
    """Train one adversarial driving policy per accident type in parallel on Ray; ASR, responsibility, diversity."""
    from palaestra.aed.attack_task import attack_task
    from palaestra.aed.report import (
        aggregate,
        comparison_figure,
        comparison_table,
        curves_figure,
        diversity_figure,
        headline,
        rates_figure,
    )
    from palaestra.aed.rewards import register_reward
    from palaestra.aed.sandbox import LazySandboxedReward
    from palaestra.shared.cluster import TaskFailure, parallel_map

    attack_tasks(cfg)  # the config's errors before any LLM call
    if cfg.require_qualified_victim:
        from palaestra.aed.qualify import check_qualified

        check_qualified(cfg)
    else:
        print(f"[aed] WARNING: victim {cfg.victim} attacked without qualification (require_qualified_victim=false)")
    proposed = _propose(cfg, tracker) if cfg.taxonomy in ("llm", "both") else None
    tasks = attack_tasks(cfg, proposed)
    for task in tasks:
        task.update(
            cfg=cfg, run_id=tracker.child_run_id(task["name"], {"accident_type": task.get("accident_type", "random")})
        )
    results = parallel_map(
        attack_task,
        tasks,
        num_cpus=cfg.cpus_per_task,
        max_retries=cfg.max_retries,
        keep_going=True,
        desc="aed.attack",
        cluster=cfg.cluster,
    )
    summary: dict[str, Any] = {}
    failures = []
    by_scenario: dict[str, list[dict]] = {}
    for task, res in zip(tasks, results):
        if isinstance(res, TaskFailure):
            failures.append({"task": task["name"], "error": res.error})
            print(f"[aed] task {task['name']} failed: {res.error}")
            continue
        by_scenario.setdefault(task["scenario"], []).append(res)
        if res.get("reward_source") == "llm":  # the kept LLM reward, usable from the driver too (sandboxed, lazily)
            res["registered_reward"] = register_reward(
                f"aed/llm/{task['scenario']}/{task['accident_type']}", LazySandboxedReward(res["reward_code"])
            )
    metrics = aggregate(by_scenario)
    for scenario, items in by_scenario.items():
        types: dict[str, int] = {}
        for r in items:
            if r["kind"] == "attack":
                for t, n in r["types"].items():
                    types[t] = types.get(t, 0) + n
        summary[scenario] = {"types_found": types, "results": items}
        if cfg.rewards == "both":
            tracker.log_figure(comparison_figure(scenario, items), f"{scenario}_expert_vs_llm")
        tracker.log_figure(rates_figure(scenario, items), f"{scenario}_rates")
        if cfg.rewards == "both" or cfg.taxonomy == "both":
            tracker.log_figure(diversity_figure(scenario, items), f"{scenario}_diversity")
        tracker.log_figure(curves_figure(scenario, items), f"{scenario}_learning_curves")
    if cfg.rewards == "both":
        table = comparison_table(by_scenario, cfg.llm.backend)
        tracker.log_text(table, "expert_vs_llm.md")
        print(table)
    if cfg.passive_baseline and metrics:
        from palaestra.aed.contrast import seeds_table

        vs_passive = seeds_table([metrics])
        tracker.log_text(vs_passive, "vs_passive.md")
        print(vs_passive)
    tracker.log_metrics(metrics)
    tracker.log_dict({"summary": summary, "failures": failures}, "aed_summary.json")
    metrics["aed/failed_tasks"] = len(failures)
    return {**metrics, "failures": failures, "summary": summary, "headline": headline(by_scenario)}


def _propose(cfg: AttackConfig, tracker: Tracker) -> dict[str, list[dict]]:
    """Per scenario, the LLM's accident types (or the fixed taxonomy when its answer is unusable), logged."""
    from palaestra.aed.proposals import propose_types
    from palaestra.shared.llm import make_client

    client = make_client(cfg.llm)
    proposed = {}
    for scenario in cfg.scenarios:
        p = cfg.proposals
        out = propose_types(client, scenario, p.n_types, p.temperature, p.max_tokens, seed=cfg.seed, retries=p.retries)
        proposed[scenario] = [t.to_dict() for t in out["types"]]
        tracker.log_dict({**out, "types": proposed[scenario]}, f"proposals/{scenario}.json")
        tracker.set_tags({f"aed.{scenario}.taxonomy": out["source"]})
        names = ", ".join(t["name"] for t in proposed[scenario])
        print(f"[aed] {scenario}: accident types from {out['source']} ({cfg.llm.backend}): {names}")
    return proposed
