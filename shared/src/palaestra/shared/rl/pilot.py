"""A pilot pass: the starting policy plays each candidate task ``samples`` times; only tasks with mixed rewards
are trained on.

A task whose group rewards are all equal gets zero GRPO advantages; DAPO drops such prompts per step (rl/
dynamic_sampling.py), and EGPO-style runs filter the data once before training with the starting policy (the
"offline" variant of the same rule). With ``pilot.enabled``, before the first step (after the SFT warm start, on
the training rollouts and their sampling settings, groups of ``pilot.samples``):

- candidates: every task of every env (`task_sampling.task_count`), or a seeded random ``candidates`` of them;
- they are played in chunks of ``chunk_tasks`` tasks; each chunk's rewards go to the cache as one JSON line
  (``cache``; default ``<output_dir>/pilot.jsonl``, whose first line fingerprints the model, envs, rollout and
  pilot settings), so an interrupted pass resumes at its first unplayed chunk and a finished one costs nothing;
  a cache of other settings is refused in one line. Progress is one tqdm line;
- a task is kept when its group is mixed (`dynamic_sampling.is_mixed`, ``tolerance``); the trainer then draws
  only kept tasks (`TaskSampler.set_pool`: epochs over them, or with replacement one of an env's kept tasks);
- logged at step 0: ``pilot/candidates``, ``pilot/kept``, ``pilot/kept_share``, ``pilot/all_equal_zero``
  (every reward 0: unsolved), ``pilot/all_equal_nonzero`` (solved by every sample, for a 0/1 reward),
  ``pilot/no_usable`` (no usable trajectory), ``pilot/played`` (tasks played now, not from the cache),
  ``pilot/reward_mean`` and per env ``pilot/<env>/kept``, ``pilot/<env>/candidates``; the artifact
  ``pilot/summary.json`` lists the kept tasks. No task kept stops the run with one line.

Off by default. A resumed run reads the cache; it re-plays only if the cache is gone (then with the resumed,
trained weights: keep the cache).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from palaestra.shared.rl.dynamic_sampling import group_rewards, is_mixed
from palaestra.shared.rollout.engine import EpisodeSpec

if TYPE_CHECKING:
    from palaestra.shared.rl.config import TrainConfig
    from palaestra.shared.rl.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class PilotConfig:
    """The pilot pass (rl/pilot.py): keep the tasks whose rewards are mixed under the starting policy."""

    enabled: bool = False
    """Run it before training (off: every task is trained on)."""
    samples: int = 8
    """Samples per candidate task (k); >= 2."""
    candidates: int = 0
    """Candidate tasks: 0 every task of every env, N a seeded random N of them."""
    tolerance: float = 0.0
    """Rewards within this of each other count as equal (0: exactly equal)."""
    chunk_tasks: int = 16
    """Tasks per rollout call: the cache's and the progress line's unit."""
    cache: str = ""
    """The cache file (JSON lines; empty: ``<output_dir>/pilot.jsonl``)."""
    seed: int | None = None
    """The candidates' draw and the rollouts' seed (None: the run's ``seed``). Set it, with one ``cache``, to give
    every run of a seed matrix the same pilot-filtered tasks (played once)."""


class PilotError(ValueError):
    """The pilot pass cannot give a task pool (a stale cache, no task kept); one line."""


def check_pilot(value: PilotConfig, owner: TrainConfig) -> str | None:
    """Values the pass cannot run with; one line each."""
    if not value.enabled:
        return None
    if value.samples < 2:
        return f"samples must be >= 2 (a group of {value.samples} is never mixed)"
    if value.candidates < 0:
        return f"candidates must be >= 0 (0: every task), got {value.candidates}"
    if value.tolerance < 0:
        return f"tolerance must be >= 0, got {value.tolerance}"
    if value.chunk_tasks < 1:
        return f"chunk_tasks must be >= 1, got {value.chunk_tasks}"
    return None


def candidate_tasks(counts: list[int], candidates: int, seed: int) -> list[tuple[int, int]]:
    """Every ``(env index, task index)``, or a seeded random `candidates` of them, in env and task order."""
    every = [(e, i) for e, count in enumerate(counts) for i in range(count)]
    if 0 < candidates < len(every):
        every = sorted(random.Random(f"pilot/{seed}").sample(every, candidates))
    return every


def fingerprint(cfg: TrainConfig, counts: list[int]) -> str:
    """What decides the pass's rewards: the model, its warm start, the envs, the rollout, seed and pilot settings."""
    opts = cfg.pilot
    parts = {
        "model": cfg.llm.model,
        "sft_warmup": dataclasses.asdict(cfg.sft_warmup),
        "envs": [dataclasses.asdict(e) for e in cfg.envs],
        "counts": counts,
        "rollout": dataclasses.asdict(cfg.rollout),
        "seed": pilot_seed(cfg),
        "pilot": [opts.samples, opts.candidates, opts.chunk_tasks],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_cache(path: Path, stamp: str) -> dict[int, list[dict[str, Any]]]:
    """The chunks a cache holds ({chunk: its tasks}); a torn last line is a chunk not played."""
    if not path.is_file():
        return {}
    lines = path.read_text().splitlines()
    head = json.loads(lines[0]) if lines else {}
    if head.get("fingerprint") != stamp:
        raise PilotError(
            f"pilot cache {path} was made with other settings (model, envs, rollout, seed or pilot): "
            "delete it or set pilot.cache to another file"
        )
    chunks = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        chunks[int(row["chunk"])] = row["tasks"]
    return chunks


def pilot_seed(cfg: TrainConfig) -> int:
    """``pilot.seed``, or the run's seed."""
    return cfg.seed if cfg.pilot.seed is None else cfg.pilot.seed


def chunk_seed(seed: int, chunk: int) -> int:
    """The rollout seed of chunk `chunk`, apart from the step and evaluation seeds (a 31-bit hash)."""
    return int(hashlib.sha256(f"pilot/{seed}/{chunk}".encode()).hexdigest()[:8], 16) % 2**31


def play_chunk(cfg: TrainConfig, rollouts: Any, picks: list[tuple[int, int]], chunk: int) -> list[dict[str, Any]]:
    """Play `picks` ``samples`` times each; per task its env, index, each agent's usable rewards and the response
    tokens of its group (what the pass cost)."""
    from palaestra.shared.rl.episodes import make_env

    specs = []
    for e, index in picks:
        env = cfg.envs[e]
        make = functools.partial(make_env, env.name, dict(env.kwargs))
        specs.append(EpisodeSpec(make, index, f"pilot-{e}-{index}"))
    rollout = dataclasses.replace(cfg.rollout, group_size=cfg.pilot.samples)
    result = rollouts.run(specs, chunk_seed(pilot_seed(cfg), chunk), rollout)
    groups, tokens = group_rewards(result), Counter[str]()
    for t in result.trajectories:
        tokens[t.group_id] += t.num_response_tokens
    return [
        {"env": e, "task": index, "rewards": dict(groups.get(g, {})), "tokens": tokens[g]}
        for e, index in picks
        for g in [f"pilot-{e}-{index}"]
    ]


def verdict(rewards: dict[str, list[float]], tolerance: float) -> str:
    """mixed | all_equal_zero | all_equal_nonzero | no_usable, for one task's rewards per agent."""
    values = [r for agent in rewards.values() for r in agent]
    if not values:
        return "no_usable"
    if is_mixed(rewards, tolerance):
        return "mixed"
    return "all_equal_zero" if all(v == 0 for v in values) else "all_equal_nonzero"


def run_pilot(trainer: Trainer) -> dict[str, float]:
    """The pilot pass of `trainer`'s run (``cfg.pilot``; off: nothing, {}), on its started rollouts: sets its task
    sampler's pools to the kept tasks; logs and returns the ``pilot/...`` counts."""
    from palaestra.shared.rl.episodes import make_env
    from palaestra.shared.rl.task_sampling import source_labels, task_count

    cfg, opts = trainer.cfg, trainer.cfg.pilot
    if not opts.enabled:
        return {}
    t0 = time.perf_counter()
    counts = trainer.tasks.task_counts or [task_count(make_env(e.name, dict(e.kwargs))) for e in cfg.envs]
    picks = candidate_tasks(counts, opts.candidates, pilot_seed(cfg))
    chunks = [picks[c : c + opts.chunk_tasks] for c in range(0, len(picks), opts.chunk_tasks)]
    path = Path(opts.cache or Path(cfg.output_dir) / "pilot.jsonl")
    stamp = fingerprint(cfg, counts)
    done = read_cache(path, stamp)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fingerprint": stamp, "candidates": len(picks), "samples": opts.samples}) + "\n")
    played = 0
    with tqdm(total=len(picks), initial=sum(len(done[c]) for c in done if c < len(chunks)), desc="pilot") as bar:
        for c, chunk in enumerate(chunks):
            if c in done:
                continue
            done[c] = play_chunk(cfg, trainer.rollouts, chunk, c)
            with path.open("a") as f:
                f.write(json.dumps({"chunk": c, "tasks": done[c]}) + "\n")
            played += len(chunk)
            bar.update(len(chunk))
            bar.set_postfix(kept=sum(verdict(t["rewards"], opts.tolerance) == "mixed" for k in done for t in done[k]))
    tasks = [t for c in range(len(chunks)) for t in done[c]]
    verdicts = [verdict(t["rewards"], opts.tolerance) for t in tasks]
    pools: list[list[int]] = [[] for _ in cfg.envs]
    for t, v in zip(tasks, verdicts, strict=True):
        if v == "mixed":
            pools[t["env"]].append(t["task"])
    kept = sum(len(p) for p in pools)
    rewards = [r for t in tasks for agent in t["rewards"].values() for r in agent]
    metrics = {
        "pilot/candidates": float(len(tasks)),
        "pilot/kept": float(kept),
        "pilot/kept_share": kept / max(len(tasks), 1),
        **{f"pilot/{v}": float(verdicts.count(v)) for v in ("all_equal_zero", "all_equal_nonzero", "no_usable")},
        "pilot/played": float(played),
        "pilot/reward_mean": sum(rewards) / max(len(rewards), 1),
        "pilot/seconds": time.perf_counter() - t0,
    }
    for e, label in enumerate(source_labels(cfg.envs)):
        metrics[f"pilot/{label}/kept"] = float(len(pools[e]))
        metrics[f"pilot/{label}/candidates"] = float(sum(t["env"] == e for t in tasks))
    trainer.tracker.log_metrics(metrics, step=0)
    trainer.tracker.log_dict({"metrics": metrics, "kept": pools, "cache": str(path)}, "pilot/summary.json")
    log.info("pilot: kept %d of %d tasks with mixed rewards (%s)", kept, len(tasks), path)
    if not kept:
        zero, nonzero = verdicts.count("all_equal_zero"), verdicts.count("all_equal_nonzero")
        raise PilotError(
            f"pilot kept no task of {len(tasks)}: every group's rewards are equal ({zero} all 0, {nonzero} all equal"
            " non-zero); raise pilot.samples or pick other tasks"
        )
    trainer.tasks.set_pool(pools)
    return metrics
