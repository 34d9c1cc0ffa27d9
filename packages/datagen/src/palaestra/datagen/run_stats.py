"""Per-run statistics of a generation run (the report logged to MLflow as ``stats.json``).

calls per trace, hidden-step fraction, coverage of environments and
functions, pass rate per try (of the tries made at index k, the share that
passed), drops by reason (``drops``; a grounding drop is named after its
first problem, ``grounding_problems`` counts every problem found), LLM calls
per kept sample, requests and characters / tokens per role
(``llm_usage_by_role``, and per kept sample: multiply by a target size for the expected load; tokens only where
the server returns token ids, as vLLM and ``palaestra serve`` do), failed LLM requests (``llm_errors``, by cause
in ``llm_error_causes``), the judge filter's counts (``judge``: judged, passed,
dropped under the threshold or without a score, samples per score), throughput.
`audit_rows` re-checks a finished file: the contamination check against BFCL's test entries, the groundedness verifier
on every kept row (``ungrounded_kept``), error responses among ground-truth
steps (``error_response_steps``), the goal-coherence check on every kept row (``incoherent_kept``, by
problem; ``coherence`` counts the samples checked and dropped at generation time), and what the data
teaches (``quality``: `quality.quality_figures`) and how hard it is in BFCL's terms (``hardness``: parallel
calls, cross-turn dependence, calls per turn, pasted descriptions, reasoning sentences; `hardness`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class RunStats:
    envs: dict[str, list[str]]
    k_max: int = 3
    kept: int = 0
    dropped: int = 0
    duplicates: int = 0
    near_duplicates: int = 0
    resumed: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    grounding_problems: dict[str, int] = field(default_factory=dict)
    tries: list[int] = field(default_factory=list)
    passes: list[int] = field(default_factory=list)
    llm_calls: int = 0
    llm_usage: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per role: requests, prompt / completion characters and tokens (`llm_roles.CountingClient.by_role`)."""
    llm_errors: dict[str, int] = field(default_factory=dict)
    """Failed LLM requests by cause (`llm_roles.error_cause`)."""
    judge_scores: dict[str, int] = field(default_factory=dict)
    """Judge filter (`judge`): judged samples by score (``"none"``: no score in the answer)."""
    coherence_checked: int = 0
    """Samples that reached the goal-coherence check (`coherence.check_row`: grounded ones)."""
    coherence_problems: dict[str, int] = field(default_factory=dict)
    """Per coherence problem, the samples that had it (a sample can have several)."""
    calls: int = 0
    traces: int = 0
    hidden: int = 0
    seen: set = field(default_factory=set)
    task_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, result: dict, kept: bool) -> None:
        chain = result["stats"]["chain"]
        for name, k in (("tries", self.tries), ("passes", self.passes)):
            for i, n in enumerate(chain.get(name, [])):
                while len(k) <= i:
                    k.append(0)
                k[i] += n
        self.llm_calls += result.get("llm_calls", 0)
        for role, use in result.get("llm_usage", {}).items():
            mine = self.llm_usage.setdefault(role, {})
            for k, v in use.items():
                mine[k] = mine.get(k, 0) + v
        for cause, n in result.get("llm_errors", {}).items():
            self.llm_errors[cause] = self.llm_errors.get(cause, 0) + n
        if "judge_score" in result:
            key = "none" if result["judge_score"] is None else f"{result['judge_score']:g}"
            self.judge_scores[key] = self.judge_scores.get(key, 0) + 1
        if "coherence" in result:
            self.coherence_checked += 1
            for problem in result["coherence"]:
                self.coherence_problems[problem] = self.coherence_problems.get(problem, 0) + 1
        for problem in result.get("problems", []):
            self.grounding_problems[problem] = self.grounding_problems.get(problem, 0) + 1
        if result["sample"] is None:
            self.dropped += 1
            self.drops[result["drop"]] = self.drops.get(result["drop"], 0) + 1
            return
        if not kept:
            return
        self.kept += 1
        for trace in json.loads(result["sample"]["provenance"]["trace"]):
            self.traces += 1
            self.calls += len(trace["steps"])
            self.hidden += sum(
                1 for i in {v for s in trace["steps"] for v in s["feeds"].values()} if i < len(trace["steps"]) - 1
            )
            self.seen |= {(result["sample"]["provenance"]["env"], s["name"]) for s in trace["steps"]}

    def progress_metrics(self) -> dict:
        return {"progress/kept": self.kept, "progress/dropped": self.dropped, "progress/llm_calls": self.llm_calls}

    def report(self) -> dict:
        n_tools = sum(len(t) for t in self.envs.values())
        per_env = {e: len({t for (env, t) in self.seen if env == e}) / len(tools) for e, tools in self.envs.items()}
        out = {
            "kept": self.kept,
            "dropped": self.dropped,
            "duplicates": self.duplicates,
            "near_duplicates": self.near_duplicates,
            "resumed_items": self.resumed,
            "calls_per_trace": self.calls / self.traces if self.traces else 0.0,
            "hidden_step_fraction": self.hidden / self.calls if self.calls else 0.0,
            "env_coverage": sum(1 for v in per_env.values() if v > 0) / len(self.envs) if self.envs else 0.0,
            "function_coverage": len(self.seen) / n_tools if n_tools else 0.0,
            "llm_calls": self.llm_calls,
            "llm_calls_per_kept_sample": self.llm_calls / self.kept if self.kept else float(self.llm_calls),
            "llm_usage_by_role": self.llm_usage,
            "llm_per_kept_sample_by_role": {
                r: {k: v / self.kept for k, v in u.items()} for r, u in self.llm_usage.items() if self.kept
            },
            "llm_errors": sum(self.llm_errors.values()),
            "llm_error_causes": dict(sorted(self.llm_errors.items())),
            "seconds": self.seconds,
            "samples_per_minute": 60 * self.kept / self.seconds if self.seconds else 0.0,
            "task_failures": len(self.task_failures),
        }
        for k, n in enumerate(self.tries):
            if n:  # of the tries made at index k, the share that passed
                out[f"pass_rate_try_{k + 1}"] = self.passes[k] / n if k < len(self.passes) else 0.0
        for reason, n in self.drops.items():
            out[f"drop_{reason}"] = n
        out["drops"] = dict(sorted(self.drops.items()))
        if self.judge_scores:
            judged = sum(self.judge_scores.values())
            low, none = self.drops.get("judge:low_score", 0), self.drops.get("judge:no_score", 0)
            out["judge"] = {
                "judged": judged,
                "passed": judged - low - none,
                "dropped_low_score": low,
                "dropped_no_score": none,
                "scores": dict(sorted(self.judge_scores.items(), key=lambda kv: float(kv[0].replace("none", "99")))),
            }
        out["grounding_problems"] = dict(sorted(self.grounding_problems.items()))
        from palaestra.datagen.coherence import PROBLEMS

        dropped = sum(n for r, n in self.drops.items() if r.startswith("coherence_"))
        out["coherence"] = {
            "checked": self.coherence_checked,
            "dropped": dropped,
            "problems": {p: self.coherence_problems.get(p, 0) for p in PROBLEMS},
        }
        out["function_coverage_per_env"] = per_env
        return out


def audit_rows(rows: list[dict]) -> dict:
    """Contamination, groundedness and error-response counts over finished rows (for ``stats.json``)."""
    from palaestra.datagen.coherence import check_row
    from palaestra.datagen.contamination import ContaminationIndex
    from palaestra.datagen.envs import get_env, is_error_response
    from palaestra.datagen.grounding import verify_row
    from palaestra.datagen.hardness import hardness_figures
    from palaestra.datagen.quality import quality_figures

    ungrounded = 0
    problems: dict[str, int] = {}
    error_steps = 0
    incoherent: dict[str, int] = {}
    for row in rows:
        for p in check_row(row, get_env(row["provenance"]["env"])):
            incoherent[p] = incoherent.get(p, 0) + 1
        found = verify_row(row, get_env(row["provenance"]["env"]))
        ungrounded += bool(found)
        for p in found:
            problems[p] = problems.get(p, 0) + 1
        for trace in json.loads(row["provenance"]["trace"]):
            error_steps += sum(is_error_response(s["output"]) for s in trace["steps"])
    return {
        "contamination": ContaminationIndex.from_bfcl().summary(rows),
        "ungrounded_kept": ungrounded,
        "ungrounded_kept_problems": problems,
        "error_response_steps": error_steps,
        "incoherent_kept": incoherent,
        "quality": quality_figures(rows),
        "hardness": hardness_figures(rows),
    }
