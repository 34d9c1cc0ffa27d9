"""The ``datagen.generate`` job: verified samples from executable environments, on Ray workers.

The driver builds (or loads) the API graph, plans the work items (one per
sample: environment round-robin, targets allotted in proportion to the
graph's tool weights, three times for a tool another's output can feed, by
smooth weighted round-robin, so every tool is a target), skips items a previous run finished, fans chunks of items out
with `palaestra.shared.cluster.parallel_map` (``workers: 0`` runs them in
process), and appends every verified sample to the JSONL as its chunk
returns. Per batch it logs progress metrics; at the end a stats report
(`run_stats.RunStats.report`) and the graph (``graph.json``, ``graph.png``) go to MLflow.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from palaestra.datagen.dataset import SampleWriter, read_rows
from palaestra.datagen.envs import BFCL_CLASSES, get_env
from palaestra.datagen.graph import ApiGraph
from palaestra.datagen.pipeline import ItemConfig, RolesConfig, generate_item, make_roles
from palaestra.datagen.run_stats import RunStats, audit_rows
from palaestra.datagen.turnplan import FED_BONUS
from palaestra.shared.config import ConfigError, JobConfig, value_check
from palaestra.shared.jobs import format_headline, job
from palaestra.shared.stats import wilson_interval
from palaestra.shared.tracking import Tracker, scratch_dir


@dataclass
class DataGenerationConfig(JobConfig):
    """Generate a verified tool-use dataset."""

    job: str = "datagen.generate"
    name: str = "default"
    """Dataset name: samples go to ``<output_dir>/datagen/<name>/samples.jsonl``."""
    envs: list[str] = field(default_factory=lambda: list(BFCL_CLASSES))
    """Environments (registered names; BFCL's eight by default)."""
    num_samples: int = 64
    """Work items (each yields one verified sample or a counted drop)."""
    workers: int = 2
    """Parallel Ray tasks in flight (0: run in this process)."""
    items_per_task: int = 8
    """Items per Ray task."""
    items_at_once: int = field(default=1, metadata=value_check("palaestra.shared.config:check_positive"))
    """Items a worker generates at once (threads), so that many LLM requests are in flight per worker; for a
    served model (``backend: openai``). Deterministic roles always go one at a time."""
    round: int = 0
    """Closed-loop round (provenance; `datagen.mine` sets it)."""
    graph: str | None = None
    """Start from this ``graph.json`` (weights from an earlier round) instead of mining a new graph."""
    near_duplicate_threshold: float | None = 0.8
    """Drop a sample whose calls (names per turn) equal a kept sample's and whose requests share at least this
    Jaccard similarity of word trigrams with it (`neardup`; counted as ``near_duplicates``); null: off."""
    roles: RolesConfig = field(default_factory=RolesConfig)
    item: ItemConfig = field(default_factory=ItemConfig)
    log_samples: bool = True
    """Log the JSONL as an MLflow artifact at the end."""

    @property
    def output_path(self) -> Path:
        return Path(self.output_dir) / "datagen" / self.name / "samples.jsonl"


def build_graph(envs: list[str], seed: int = 0) -> ApiGraph:
    graph = ApiGraph()
    for name in envs:
        graph.add_env(get_env(name), probe=True, seed=seed)
    return graph


def plan_items(cfg: DataGenerationConfig, graph: ApiGraph) -> list[dict]:
    """Deterministic work items; targets per environment in proportion to tool weights, a tool that another's
    output can feed `FED_BONUS` times more (a goal whose steps feed each other; every tool is still a target)."""
    rng = random.Random(cfg.seed * 1000003 + cfg.round)
    credit: dict[str, dict[str, float]] = {}
    items = []
    for i in range(cfg.num_samples):
        env = cfg.envs[i % len(cfg.envs)]
        tools = graph.tools(env)
        credit.setdefault(env, {t: rng.random() * 1e-3 for t in tools})  # tiny jitter breaks ties by seed
        weights = {t: graph.weight(env, t) * (FED_BONUS if graph.fed(env, t) else 1.0) for t in tools}
        total = sum(weights.values())
        for t in tools:
            credit[env][t] += weights[t]
        target = max(tools, key=lambda t: credit[env][t])
        credit[env][target] -= total
        seed = int(hashlib.sha1(f"{cfg.seed}-{cfg.round}-{i}".encode()).hexdigest()[:8], 16)
        items.append(
            {
                "id": f"{cfg.name}-s{cfg.seed}-r{cfg.round}-{i}",
                "env": env,
                "target": target,
                "seed": seed,
                "scenario": seed,
                "round": cfg.round,
            }
        )
    return items


def run_chunk(payload: dict) -> list[dict]:
    """A Ray task: generate every item of a chunk (roles and clients built in the worker)."""
    graph = ApiGraph.from_dict(payload["graph"])
    roles, counter = make_roles(payload["roles"])
    at_once = payload.get("items_at_once", 1)
    if counter is None or at_once <= 1:
        return [
            {"id": it["id"], **generate_item(it, graph, roles, payload["item_cfg"], counter)} for it in payload["items"]
        ]
    from concurrent.futures import ThreadPoolExecutor

    def one(item: dict) -> dict:  # its own roles and counts; the clients (thread-safe HTTP) are shared
        item_roles, item_counter = make_roles(payload["roles"], counter.fork())
        return {"id": item["id"], **generate_item(item, graph, item_roles, payload["item_cfg"], item_counter)}

    with ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(one, payload["items"]))


def run_generation(cfg: DataGenerationConfig, graph: ApiGraph, tracker: Tracker, step_offset: int = 0) -> RunStats:
    """Generate into ``cfg.output_path`` (resuming), returning the run's stats."""
    for name in cfg.envs:
        get_env(name)  # unknown names fail here, with suggestions
    make_roles(cfg.roles)  # a bad role name fails before any work
    items = plan_items(cfg, graph)
    stats = RunStats(envs={e: get_env(e).tool_names for e in cfg.envs}, k_max=cfg.item.k_max)
    started = time.perf_counter()
    with SampleWriter(cfg.output_path, cfg.near_duplicate_threshold) as writer:
        todo = [it for it in items if it["id"] not in writer.done]
        stats.resumed = len(items) - len(todo)
        chunks = [todo[i : i + cfg.items_per_task] for i in range(0, len(todo), cfg.items_per_task)]
        # every item samples on the graph as the run found it: the flows it observes (merged below, saved with
        # the graph) do not steer later items, so a resumed run makes the same samples as an uninterrupted one
        frozen = graph.to_dict()
        payloads = [
            {
                "items": c,
                "graph": frozen,
                "roles": cfg.roles,
                "item_cfg": cfg.item,
                "items_at_once": cfg.items_at_once,
            }
            for c in chunks
        ]
        batch = max(1, 2 * cfg.workers)
        from tqdm import tqdm

        with tqdm(total=len(todo), desc=f"datagen {cfg.name} r{cfg.round}", disable=False) as bar:
            for b in range(0, len(payloads), batch):
                group = payloads[b : b + batch]
                results: list
                if cfg.workers <= 0:
                    results = [run_chunk(p) for p in group]
                else:
                    from palaestra.shared.cluster import TaskFailure, parallel_map

                    results = parallel_map(
                        run_chunk,
                        group,
                        keep_going=True,
                        desc="chunks",
                        cluster=cfg.cluster,
                        progress=False,
                        in_process="workers=0",
                    )
                    for i, r in enumerate(results):
                        if isinstance(r, TaskFailure) and r.error.startswith("LLMUnavailable:"):
                            from palaestra.datagen.llm_roles import LLMUnavailable

                            raise LLMUnavailable(r.error.split(": ", 1)[1])  # the server is the problem: stop
                        if isinstance(r, TaskFailure):  # a lost chunk is counted; its items stay unfinished
                            stats.task_failures.append(r.error)
                            results[i] = []
                for chunk in results:
                    for r in chunk:
                        kept = writer.add(r["id"], r["sample"])
                        stats.add(r, kept)
                        graph.merge_stats(r["stats"]["sampler"])
                    bar.update(len(chunk))
                stats.duplicates = writer.duplicates
                stats.near_duplicates = writer.near_duplicates
                tracker.log_metrics(stats.progress_metrics(), step=step_offset + len(writer.done))
    stats.seconds = time.perf_counter() - started
    return stats


@job("datagen.generate", DataGenerationConfig)
def generate(cfg: DataGenerationConfig, tracker: Tracker) -> dict:
    """HardGen + FunReason-MT: verified (multi-turn) tool-use samples from executable environments."""
    if cfg.num_samples < 0 or cfg.items_per_task < 1:
        raise ConfigError("num_samples must be >= 0 and items_per_task >= 1")
    if cfg.near_duplicate_threshold is not None and not 0 < cfg.near_duplicate_threshold <= 1:
        raise ConfigError(f"near_duplicate_threshold must be in (0, 1] or null, got {cfg.near_duplicate_threshold}")
    graph = (
        ApiGraph.from_dict(json.loads(Path(cfg.graph).read_text())) if cfg.graph else build_graph(cfg.envs, cfg.seed)
    )
    stats = run_generation(cfg, graph, tracker)
    report = stats.report()
    if cfg.output_path.exists():
        report |= audit_rows(read_rows(cfg.output_path))
    out_dir = scratch_dir()
    (out_dir / "graph.json").write_text(json.dumps(graph.to_dict(), default=str))
    tracker.log_artifact(out_dir / "graph.json", "graph")
    if tracker.run_id is not None:
        tracker.log_figure(graph.figure(), "graph")
    tracker.log_dict(report, "stats.json")
    tracker.log_metrics({f"stats/{k}": v for k, v in report.items() if isinstance(v, int | float)})
    cfg.output_path.parent.joinpath("stats.json").write_text(json.dumps(report, indent=1))
    if cfg.log_samples and cfg.output_path.exists():
        tracker.log_artifact(cfg.output_path, "dataset")
    c = report.get("contamination", {})
    print(
        f"datagen: {report['kept']} samples -> {cfg.output_path}; {report['calls_per_trace']:.2f} calls per trace, "
        f"function coverage {report['function_coverage']:.3f}; contaminated {c.get('contaminated', 0)}, "
        f"ungrounded kept {report.get('ungrounded_kept', 0)}, incoherent kept "
        f"{sum(report.get('incoherent_kept', {}).values())}, error-response steps "
        f"{report.get('error_response_steps', 0)}; drops {report['drops']}"
    )
    if report.get("llm_calls") and report["kept"]:
        per = report["llm_calls"] / report["kept"]
        tokens = sum(u.get("completion_tokens", 0) for u in report["llm_per_kept_sample_by_role"].values())
        print(
            f"datagen: {per:.1f} LLM requests per kept sample ({report['llm_errors']} failed): "
            f"{10000 * per:,.0f} requests and {10000 * tokens:,.0f} completion tokens for 10,000 samples at this "
            f"run's rates; per role: {report['llm_per_kept_sample_by_role']}"
        )
    attempted = report["kept"] + report["dropped"]
    note = f"{report['kept']} of {attempted} items, 95% Wilson; function coverage {report['function_coverage']:.2f}"
    share = report["kept"] / attempted if attempted else 0.0
    return {
        "kept": report["kept"],
        "dropped": report["dropped"],
        "output": str(cfg.output_path),
        "samples_per_minute": report["samples_per_minute"],
        "headline": format_headline("verified and kept", share, wilson_interval(report["kept"], attempted), note),
        "artifacts": str(cfg.output_path.parent),
    }
