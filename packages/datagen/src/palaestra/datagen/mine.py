"""The ``datagen.mine`` job: the closed loop (HardGen's failure tools).

Each round: generate samples toward the graph's current weights
(`generate.run_generation`), run a *student* on every turn of them (one try,
no hint; any LLM backend, or a scripted student for offline runs), record
per tool whether the student got its step (the first step whose
ground-truth result is missing, or the last step when only the state is
wrong, counts as a failure on that tool and on the edge from the previous
step; steps after it are not scored), turn those failure rates into weights
(``1 + boost * rate``), and sample the next round toward them. Logged per
round: ``mine/student_failure_rate``, ``mine/weak_target_share`` (targets on
tools whose weight is above 1), every tool's weight (``weight/<env>.<tool>``)
and the graph (``round_<k>/graph.json`` + picture).

The scripted student (``student: scripted``) solves every turn except those
whose ground truth uses a tool in ``weak_tools``: a stand-in for a model with
known blind spots, so the loop's steering can be checked offline.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from palaestra.datagen.chain import TurnTask, run_try
from palaestra.datagen.dataset import read_rows
from palaestra.datagen.envs import ToolEnv, get_env
from palaestra.datagen.generate import DataGenerationConfig, build_graph, run_generation
from palaestra.datagen.sampler import Step, Trace
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import job
from palaestra.shared.llm.base import LLMConfig, SamplingParams
from palaestra.shared.toolcall import ToolCall, format_calls
from palaestra.shared.tracking import Tracker, scratch_dir


@dataclass
class MineConfig(DataGenerationConfig):
    """Closed loop: generate, evaluate a student, reweight the graph, repeat."""

    job: str = "datagen.mine"
    rounds: int = 3
    """Generation rounds."""
    student: str = "llm"
    """llm (any backend, `student_llm`) | scripted (fails on `weak_tools`)."""
    student_llm: LLMConfig = field(default_factory=LLMConfig)
    """The student model."""
    student_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=256))
    """Student sampling (greedy by default)."""
    weak_tools: list[str] = field(default_factory=list)
    """Scripted student: tools it always gets wrong."""
    boost: float = 4.0
    """weight = 1 + boost * student failure rate."""


class ScriptedStudent:
    """Answers with the ground truth, except turns that use a weak tool (it stops before them)."""

    name = "scripted"

    def __init__(self, weak: set[str]):
        self.weak = weak

    def act(self, messages, tools, turn, try_index, rng) -> str:
        if not turn.expects_calls:
            return "I cannot do that as asked."
        done = sum(1 for m in messages[_last_user(messages) :] if m["role"] == "tool")
        steps = turn.trace.steps
        if done >= len(steps) or steps[done].name in self.weak:
            return "Done."
        return format_calls([ToolCall(steps[done].name, steps[done].arguments)], thinking="next step")


def _last_user(messages) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] in ("user", "system"):
            return i
    return 0


def evaluate_student(rows: list[dict], student, graph) -> tuple[int, int]:
    """Run the student on each turn (from the ground-truth state); record per-tool failures in `graph`."""
    from palaestra.datagen.roles import Roles

    roles = Roles(None, None, student, None)
    failed_turns = turns_total = 0
    for row in rows:
        spec = get_env(row["provenance"]["env"])
        env = ToolEnv(spec, json.loads(row["initial_config"])[row["involved_classes"][0]])
        tools = json.loads(row["tools"])
        traces = iter(json.loads(row["provenance"]["trace"]))
        history: list[dict] = []
        trace = None
        for turn in row["turns"]:
            if turn["kind"] in ("normal", "miss_param", "miss_func"):
                t = next(traces)
                trace = Trace(
                    spec.name,
                    t["target"],
                    [Step(s["name"], s["arguments"], s["output"]) for s in t["steps"]],
                    t["target_hit"],
                )
            task = TurnTask(turn["query"], trace, tools, turn["kind"])
            result = run_try(roles, env, history, task, None, 0, random.Random(0), 12)
            turns_total += 1
            failed_turns += int(not result.passed)
            if task.expects_calls:
                missing = list(result.failure.get("missing_tools", []))
                if not result.passed and not missing:
                    missing = [trace.steps[-1].name]
                prev = None
                for s in trace.steps:  # the first missing step is the student's failure; later ones follow from it
                    failed = s.name in missing
                    graph.record_student(spec.name, s.name, failed, prev)
                    if failed:
                        break
                    prev = s.name
            history = history + result.messages
            env = result.truth
    return failed_turns, turns_total


@job("datagen.mine", MineConfig)
def mine(cfg: MineConfig, tracker: Tracker) -> dict:
    """Closed loop: student failures on generated samples steer the next round's sampling."""
    if cfg.student not in ("llm", "scripted"):
        raise ConfigError(f"student: unknown kind {cfg.student!r} (llm | scripted)")
    if cfg.student == "scripted":
        student = ScriptedStudent(set(cfg.weak_tools))
    else:
        from palaestra.datagen.llm_roles import CountingClient, LLMReasoner
        from palaestra.shared.llm import make_client

        student = LLMReasoner(CountingClient(make_client(cfg.student_llm), cfg.student_sampling))
    graph = build_graph(cfg.envs, cfg.seed)
    history = []
    base_name = cfg.name
    for k in range(cfg.rounds):
        cfg.round, cfg.name = k, f"{base_name}/round_{k}"
        stats = run_generation(cfg, graph, tracker, step_offset=k * cfg.num_samples)
        rows = read_rows(cfg.output_path) if cfg.output_path.exists() else []
        weak = {n for n, d in graph.g.nodes(data=True) if d["weight"] > 1.0}
        weak_share = sum(1 for r in rows if f"{r['provenance']['env']}.{r['provenance']['target']}" in weak)
        failed, total = evaluate_student(rows, student, graph)
        rate = failed / total if total else 0.0
        weights = graph.update_weights(cfg.boost)
        metrics = {
            "mine/student_failure_rate": rate,
            "mine/kept": stats.kept,
            "mine/weak_target_share": weak_share / len(rows) if rows else 0.0,
            **{f"weight/{n}": w for n, w in weights.items()},
        }
        tracker.log_metrics(metrics, step=k)
        out = scratch_dir()
        for path in graph.save(out):
            tracker.log_artifact(path, f"round_{k}")
        history.append(
            {
                "round": k,
                "failure_rate": rate,
                "weak_target_share": metrics["mine/weak_target_share"],
                "kept": stats.kept,
            }
        )
        print(
            f"mine round {k}: student failure rate {rate:.3f}, weak-target share "
            f"{metrics['mine/weak_target_share']:.3f}, {stats.kept} samples"
        )
    tracker.log_dict(history, "rounds.json")
    return {"rounds": cfg.rounds, "final_failure_rate": history[-1]["failure_rate"] if history else 0.0}
