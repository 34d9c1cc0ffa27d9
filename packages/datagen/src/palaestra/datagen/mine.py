"""The ``datagen.mine`` job: the closed loop of HardGen (failure tools), with a student that learns.

Each round k:

1. generate samples toward the graph's current weights (`generate.run_generation`: targets drawn by node
   weight, transitions by edge weight);
2. split them by a hash of the sample id into a *mining* set and a *held-out* set (``heldout_fraction``);
3. run the *student* on every turn of the mining set (one try, no hint; any LLM backend, or a scripted
   student for offline runs) and record per tool whether it got its step (the first step whose
   ground-truth result is missing, or the last step when only the state is wrong, is a failure on that
   tool and on the edge from the previous step; later steps are not scored); turn the failure rates into
   node and edge weights (``1 + boost * rate``): the next round samples toward them;
4. train the student on the mining set: SFT through the shared `palaestra.shared.rl.sft.run_sft`
   (assistant tokens only, the reasoner's system prompt and the row's tools; ``student_sft.steps``; an LLM
   student on the transformers backend, which holds its weights);
5. evaluate the student on the held-out set before and after that training.

Logged per round (step k): ``mine/student_failure_rate`` (mining set, before training),
``mine/heldout_failure_rate_before`` / ``_after``, ``mine/sft_loss_first`` / ``_last``,
``mine/student_context_failures`` / ``mine/heldout_context_failures`` (turns whose prompt outgrew the student's
context: failures of the student on that sample, not request errors; they do not steer the graph),
``mine/weak_target_share`` (targets on tools whose weight is above 1), ``mine/kept``, every tool's weight
(``weight/<env>.<tool>``) and the graph (``round_<k>/graph.json``, ``figures/graph/step_<k>.png``);
``rounds.json`` at the end.

The scripted student (``student: scripted``) solves every turn except those whose ground truth uses a
tool in ``weak_tools``: a stand-in for a model with known blind spots, so the loop's steering can be
checked offline; it does not learn (step 4 is skipped).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from palaestra.datagen.chain import TurnTask, run_try
from palaestra.datagen.dataset import read_rows
from palaestra.datagen.envs import ToolEnv, get_env
from palaestra.datagen.generate import DataGenerationConfig, build_graph, run_generation
from palaestra.datagen.sampler import Trace, TraceStep
from palaestra.shared.config import value_check
from palaestra.shared.jobs import job
from palaestra.shared.llm.base import LLMConfig, SamplingParams
from palaestra.shared.rl.sft import SFTOptions
from palaestra.shared.toolcall import ToolCall, format_calls
from palaestra.shared.tracking import Tracker, scratch_dir


class StudentKind(StrEnum):
    llm = "llm"
    scripted = "scripted"


@dataclass
class MineConfig(DataGenerationConfig):
    """Closed loop: generate, evaluate a student, reweight the graph, repeat."""

    job: str = "datagen.mine"
    rounds: int = 3
    """Generation rounds."""
    student: StudentKind = StudentKind.llm
    """llm (any backend, `student_llm`) | scripted (fails on `weak_tools`)."""
    student_llm: LLMConfig = field(default_factory=LLMConfig)
    """The student model."""
    student_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=256))
    """Student sampling (greedy by default)."""
    weak_tools: list[str] = field(default_factory=list)
    """Scripted student: tools it always gets wrong."""
    boost: float = 4.0
    """weight = 1 + boost * student failure rate."""
    heldout_fraction: float = field(default=0.25, metadata=value_check("palaestra.datagen.mine:check_fraction"))
    """Share of each round's samples held out from mining and training (chosen by a hash of the sample id)."""
    student_sft: SFTOptions = field(default_factory=lambda: SFTOptions(steps=0, batch_size=4, lr=1e-3))
    """The student's SFT per round on the mining set (``data_path`` is set by the job; steps 0: no training)."""


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


@dataclass
class StudentScore:
    """The student on a set of turns: turns failed, turns, and of the failed ones those whose prompt outgrew its
    context (``context``: the student never saw the whole turn)."""

    failed: int = 0
    turns: int = 0
    context: int = 0

    @property
    def rate(self) -> float:
        return self.failed / self.turns if self.turns else 0.0


class ContextGuard:
    """The student as `run_try` sees it: a prompt that outgrows its context (`PromptTooLong`) ends the try with no
    answer and is remembered, so the turn counts as the student's failure whatever its kind (an empty answer
    would otherwise pass as a miss_func refusal)."""

    def __init__(self, student):
        self.student = student
        self.name = student.name
        self.overflowed = False

    def act(self, messages, tools, turn, try_index, rng) -> str:
        from palaestra.datagen.llm_roles import PromptTooLong

        try:
            return self.student.act(messages, tools, turn, try_index, rng)
        except PromptTooLong:
            self.overflowed = True
            return ""


def evaluate_student(rows: list[dict], student, graph) -> StudentScore:
    """The student on each turn from the ground-truth state; per-tool failures go to `graph` (None: evaluation
    only). A turn the student could not read (its prompt outgrew the context) fails and is counted as ``context``;
    it says nothing about a tool, so the graph does not record it."""
    from palaestra.datagen.roles import Roles

    guard = ContextGuard(student)
    roles = Roles(None, None, guard, None)
    score = StudentScore()
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
                    [TraceStep(s["name"], s["arguments"], s["output"]) for s in t["steps"]],
                    t["target_hit"],
                )
            schema = None
            if turn["kind"] == "func_added":  # the withheld function joins the tools from this turn on
                schema = spec.doc(turn["missing"])
                tools = tools + spec.openai_tools(exclude={t["function"]["name"] for t in tools})
            assert trace is not None, "a row's first turn has a trace"
            task = TurnTask(turn["query"], trace, tools, turn["kind"], turn.get("missing"), schema)
            guard.overflowed = False
            result = run_try(roles, env, history, task, None, 0, random.Random(0), 12)
            score.turns += 1
            score.failed += int(not result.passed or guard.overflowed)
            score.context += int(guard.overflowed)
            if task.expects_calls and graph is not None and not guard.overflowed:
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
            env = result.truth if result.truth is not None else env
    return score


def is_heldout(sample_id: str, fraction: float) -> bool:
    return int(hashlib.sha1(sample_id.encode()).hexdigest()[:8], 16) / 16**8 < fraction


def write_sft_data(rows: list[dict], path: Path) -> Path:
    """The rows as SFT samples: the reasoner's system prompt, the chat, the tools (a list)."""
    from palaestra.datagen.export import openai_record
    from palaestra.datagen.llm_roles import prompt

    system = {"role": "system", "content": prompt("reasoner_system")}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            rec = openai_record(row)
            f.write(json.dumps({"messages": [system, *rec["messages"]], "tools": rec["tools"]}) + "\n")
    return path


def check_fraction(value: float, owner: MineConfig) -> str | None:
    """A share of the items strictly between 0 and 1."""
    return None if 0.0 < value < 1.0 else f"must be in (0, 1), got {value}"


@job("datagen.mine", MineConfig)
def mine(cfg: MineConfig, tracker: Tracker) -> dict:
    """Closed loop: mine the student's failures, reweight the graph, generate, train the student, evaluate."""
    client: Any = None
    student: Any
    if cfg.student == "scripted":
        student = ScriptedStudent(set(cfg.weak_tools))
    else:
        from palaestra.datagen.llm_roles import CountingClient, LLMReasoner
        from palaestra.shared.llm import make_client

        client = make_client(cfg.student_llm)
        student = LLMReasoner(CountingClient(client, cfg.student_sampling, context_failures=True))
    trainable = client is not None and hasattr(client, "model") and cfg.student_sft.steps > 0
    graph = build_graph(cfg.envs, cfg.seed)
    history = []
    base_name = cfg.name
    for k in range(cfg.rounds):
        cfg.round, cfg.name = k, f"{base_name}/round_{k}"
        stats = run_generation(cfg, graph, tracker, step_offset=k * cfg.num_samples)
        rows = read_rows(cfg.output_path) if cfg.output_path.exists() else []
        heldout = [r for r in rows if is_heldout(r["id"], cfg.heldout_fraction)]
        mining = [r for r in rows if not is_heldout(r["id"], cfg.heldout_fraction)]
        weak = {n for n, d in graph.g.nodes(data=True) if d["weight"] > 1.0}
        weak_share = sum(1 for r in rows if f"{r['provenance']['env']}.{r['provenance']['target']}" in weak)
        score = evaluate_student(mining, student, graph)
        weights = graph.update_weights(cfg.boost)
        metrics: dict[str, Any] = {
            "mine/student_failure_rate": score.rate,
            "mine/student_context_failures": score.context,
            "mine/kept": stats.kept,
            "mine/weak_target_share": weak_share / len(rows) if rows else 0.0,
            **{f"weight/{n}": w for n, w in weights.items()},
        }
        before = evaluate_student(heldout, student, None)
        metrics["mine/heldout_failure_rate_before"] = before.rate
        metrics["mine/heldout_context_failures"] = before.context
        if trainable and mining:
            from palaestra.shared.rl.sft import run_sft

            data = write_sft_data(mining, cfg.output_path.parent / "sft_train.jsonl")
            opts = dataclasses.replace(cfg.student_sft, data_path=str(data), seed=cfg.seed + k)
            losses = run_sft(client.model, client.tokenizer, opts)
            metrics |= {f"mine/sft_{key}": v for key, v in losses.items()}
            after = evaluate_student(heldout, student, None)
            metrics["mine/heldout_failure_rate_after"] = after.rate
        tracker.log_metrics(metrics, step=k)
        out = scratch_dir()
        (out / "graph.json").write_text(json.dumps(graph.to_dict(), default=str))
        tracker.log_artifact(out / "graph.json", f"round_{k}")
        if tracker.run_id is not None:
            tracker.log_figure(graph.figure(), "graph", step=k)
        record: dict[str, Any] = {"round": k, "heldout_samples": len(heldout), "mining_samples": len(mining)}
        record |= {key.split("/", 1)[1]: v for key, v in metrics.items() if key.startswith("mine/")}
        record["drops"] = dict(sorted(stats.drops.items()))
        history.append(record)
        print(f"mine round {k}: " + ", ".join(f"{key} {v:.3f}" if isinstance(v, float) else f"{key} {v}"
                                              for key, v in record.items() if key != "round"))  # fmt: skip
    tracker.log_dict(history, "rounds.json")
    (Path(cfg.output_dir) / "datagen" / base_name / "rounds.json").write_text(json.dumps(history, indent=1))
    return {"rounds": cfg.rounds, "final_failure_rate": history[-1]["student_failure_rate"] if history else 0.0}
