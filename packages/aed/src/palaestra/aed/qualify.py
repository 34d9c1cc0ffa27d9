"""Victim qualification: a victim is a target only once it drives safely alone.

`qualify` measures a victim against passive adversaries (IDLE: keep lane and speed) on fixed episode seeds of
their own: its accident rate and the share of those accidents it is responsible for, each with a 95% Wilson
interval. It passes at an accident rate of at most `MAX_ACCIDENT_RATE` over at least `MIN_EPISODES` episodes;
otherwise every attack rate measured against it would be the victim's own crashes.

The ``aed.qualify`` job writes one record per scenario (`record_path`: beside an RL victim's checkpoint, or under
``<output_dir>/victims/`` for IDM). ``aed.attack`` refuses a victim without a passing record for the same traffic
(`check_qualified`) unless ``require_qualified_victim: false``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.aed.attack import VictimKind
from palaestra.aed.scenarios import AdversaryPlacement
from palaestra.shared.config import ConfigError, JobConfig, value_check
from palaestra.shared.jobs import job
from palaestra.shared.tracking import Tracker

MIN_EPISODES = 100
MAX_ACCIDENT_RATE = 0.05
SEED_OFFSET = 90_000
"""Qualification episodes are seeded apart from the attacks' evaluation episodes (``seed + 50_000``)."""


def check_episodes(value: int, owner: Any) -> str | None:
    """At least `MIN_EPISODES` (fewer cannot tell 0.05 from 0.10)."""
    return None if value >= MIN_EPISODES else f"must be at least {MIN_EPISODES}, got {value}"


def check_rate(value: float, owner: Any) -> str | None:
    """In [0, `MAX_ACCIDENT_RATE`]: a laxer bar would qualify a victim that crashes on its own."""
    return None if 0 <= value <= MAX_ACCIDENT_RATE else f"must be in [0, {MAX_ACCIDENT_RATE}], got {value}"


@dataclass
class QualifyConfig(JobConfig):
    job: str = "aed.qualify"
    scenarios: list[str] = field(
        default_factory=lambda: ["highway"], metadata=value_check("palaestra.aed.attack:check_scenarios")
    )
    victim: VictimKind = VictimKind.idm
    """idm | rl (a frozen SB3 policy from victim_checkpoint)."""
    victim_checkpoint: str | None = None
    """As in aed.attack: ``{scenario}`` is replaced by each scenario's name."""
    num_adversaries: int = 1
    adversary_placement: AdversaryPlacement = AdversaryPlacement.nearest
    env_overrides: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = None
    """The traffic: these four must equal the attack's, or the record does not apply to it."""
    episodes: int = field(default=MIN_EPISODES, metadata=value_check("palaestra.aed.qualify:check_episodes"))
    max_accident_rate: float = field(
        default=MAX_ACCIDENT_RATE, metadata=value_check("palaestra.aed.qualify:check_rate")
    )
    """The victim passes when its accident rate alone (the point estimate) is at most this."""
    requalify: bool = False
    """Measure again even if a record of this victim (same checkpoint bytes), traffic, seed and bar exists."""
    torch_threads: int = 1


def traffic(cfg: Any) -> dict[str, Any]:
    """What an attack must share with a qualification for its record to apply."""
    return {
        "num_adversaries": cfg.num_adversaries,
        "adversary_placement": str(cfg.adversary_placement),
        "env_overrides": dict(cfg.env_overrides),
        "max_steps": cfg.max_steps,
    }


def checkpoint_digest(cfg: Any, scenario: str) -> str | None:
    """sha256 of an RL victim's checkpoint (a record applies to those bytes only); None for IDM."""
    import hashlib

    from palaestra.aed.attack_task import victim_checkpoint

    if cfg.victim != "rl":
        return None
    return hashlib.sha256(Path(str(victim_checkpoint(cfg, scenario))).read_bytes()).hexdigest()


def record_path(cfg: Any, scenario: str) -> Path:
    """Where the qualification of `cfg`'s victim on `scenario` lives."""
    from palaestra.aed.attack_task import victim_checkpoint

    if cfg.victim == "rl":
        return Path(f"{victim_checkpoint(cfg, scenario)}.qualification.json")
    return Path(cfg.output_dir) / "victims" / f"{scenario}_idm.qualification.json"


def verdict(accidents: int, responsible: int, episodes: int, max_rate: float) -> dict[str, Any]:
    """The qualification figures from counts: accident rate and victim-fault share, with Wilson intervals."""
    from palaestra.shared.stats import wilson_interval

    rate = accidents / episodes
    return {
        "episodes": episodes,
        "accidents": accidents,
        "accident_rate": rate,
        "accident_rate_ci": list(wilson_interval(accidents, episodes)),
        "victim_fault": responsible,
        "victim_fault_share": responsible / accidents if accidents else 0.0,
        "victim_fault_share_ci": list(wilson_interval(responsible, accidents)),
        "max_accident_rate": max_rate,
        "passed": rate <= max_rate,
    }


def describe(scenario: str, victim: str, record: dict[str, Any]) -> str:
    lo, hi = record["accident_rate_ci"]
    return (
        f"victim {victim} on {scenario}: accident rate alone {record['accident_rate']:.3f} [{lo:.3f}, {hi:.3f}] "
        f"({record['accidents']}/{record['episodes']}), {record['victim_fault']} its own fault: "
        + ("QUALIFIED" if record["passed"] else f"NOT qualified (above {record['max_accident_rate']})")
    )


def qualify(cfg: QualifyConfig, scenario: str) -> dict[str, Any]:
    """Measure the victim of `scenario` alone against passive adversaries; the record (not yet written)."""
    from palaestra.aed.attack_task import adversary_spec
    from palaestra.aed.evaluation import IdlePolicy, evaluate

    spec = adversary_spec(cfg, scenario, "rear_end")  # the reward plays no part against passive adversaries
    ev = evaluate(IdlePolicy(cfg.num_adversaries), spec, cfg.episodes, seed=cfg.seed + SEED_OFFSET)
    responsible = sum(bool(a["victim_responsible"]) for a in ev["accidents"])
    record = verdict(len(ev["accidents"]), responsible, cfg.episodes, cfg.max_accident_rate)
    record.update(scenario=scenario, victim=str(cfg.victim), checkpoint=spec.victim_checkpoint, seed=cfg.seed)
    return {**record, "checkpoint_sha256": checkpoint_digest(cfg, scenario), **identity(cfg), "types": ev["types"]}


def identity(cfg: Any) -> dict[str, Any]:
    """What a cached record must match to be reused: the traffic, the seed, the episodes and the bar."""
    return {
        "traffic": traffic(cfg),
        "seed": cfg.seed,
        "episodes": cfg.episodes,
        "max_accident_rate": cfg.max_accident_rate,
    }


def cached(cfg: QualifyConfig, scenario: str) -> dict[str, Any] | None:
    """The existing record of this very qualification (same checkpoint bytes too), or None."""
    path = record_path(cfg, scenario)
    if cfg.requalify or not path.exists():
        return None
    record = json.loads(path.read_text())
    same = all(record.get(k) == v for k, v in identity(cfg).items())
    return record if same and record.get("checkpoint_sha256") == checkpoint_digest(cfg, scenario) else None


@job("aed.qualify", QualifyConfig)
def qualify_job(cfg: QualifyConfig, tracker: Tracker) -> dict:
    """Qualify the victim of each scenario (accident rate alone <= ``max_accident_rate``) and write its record."""
    metrics: dict[str, Any] = {}
    lines = []
    for scenario in cfg.scenarios:
        path = record_path(cfg, scenario)
        record = cached(cfg, scenario)
        if record is None:
            record = qualify(cfg, scenario)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1))
        else:
            print(f"[aed] qualification cached: {path}")
        tracker.log_dict(record, f"qualification/{scenario}.json")
        lines.append(describe(scenario, str(cfg.victim), record))
        print(f"[aed] {lines[-1]}")
        for key in ("accident_rate", "victim_fault_share"):
            metrics[f"aed/{scenario}/qualification/{key}"] = record[key]
        metrics[f"aed/{scenario}/qualification/passed"] = float(record["passed"])
    return {**metrics, "headline": "; ".join(lines)}


def check_qualified(cfg: Any) -> None:
    """Refuse (one line) an attack whose victim has no passing qualification for the attack's traffic."""
    for scenario in cfg.scenarios:
        path = record_path(cfg, scenario)
        how = "run aed.qualify first, or set require_qualified_victim=false"
        if not path.exists():
            raise ConfigError(f"victim {cfg.victim} on {scenario} is not qualified (no record {path}); {how}")
        record = json.loads(path.read_text())
        if record.get("traffic") != traffic(cfg):
            raise ConfigError(
                f"victim {cfg.victim} on {scenario} was qualified in other traffic ({record.get('traffic')} in "
                f"{path}, attack has {traffic(cfg)}); {how}"
            )
        if record.get("checkpoint_sha256") != checkpoint_digest(cfg, scenario):
            raise ConfigError(f"victim {cfg.victim} on {scenario}: its checkpoint changed since {path}; {how}")
        if not record.get("passed"):
            raise ConfigError(
                f"victim {cfg.victim} on {scenario} failed qualification: accident rate alone "
                f"{record['accident_rate']:.3f} > {record['max_accident_rate']} ({path}); train it longer, or "
                "set require_qualified_victim=false"
            )
