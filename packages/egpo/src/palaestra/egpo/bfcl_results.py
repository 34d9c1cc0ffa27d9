"""BFCL's scoreboard: its summary formula, its result and score files, its score CSV, its Qwen FC decoder.

Summary formula (`bfcl_summary`) of **BFCL v4** as ``bfcl-eval==2026.3.23`` computes it in
``eval_checker/eval_runner_helper.py::generate_leaderboard_csv``:

- non-live = unweighted mean of [simple, multiple, parallel, parallel_multiple], where simple is the
  unweighted mean of simple_python, simple_java and simple_javascript;
- live = mean of live_simple, live_multiple, live_parallel, live_parallel_multiple weighted by entry
  count (live_relevance and live_irrelevance are not in it);
- irrelevance = unweighted mean of irrelevance and live_irrelevance; relevance = live_relevance,
  reported on its own, not part of the overall;
- multi-turn = unweighted mean of base, miss_func, miss_param, long_context;
- agentic = unweighted mean of web search (mean of base, no_snippet) and memory (mean of kv, vector,
  rec_sum);
- overall = 10% non-live + 10% live + 10% irrelevance + 30% multi-turn + 40% agentic.

**BFCL v3**'s summary (`bfcl_v3_summary`), the one FunReason-MT and HardGen report, as the last v3 release of
BFCL's code computes it (gorilla ``berkeley-function-call-leaderboard/bfcl_eval/eval_checker/eval_runner_helper.py``
at commit 65a1c944, 2025-07-08, the last before "BFCL V4 Release"; ``bfcl-eval`` 2026.3.23 has no v3 code):
non-live = unweighted mean of [simple, multiple, parallel, parallel_multiple, irrelevance]; live = entry-weighted
mean of the four live AST categories *and* live_irrelevance and live_relevance; multi-turn = mean of its four;
single-turn = mean of non-live and live (v3's ``single_turn_ast``, the papers' "single-turn overall");
overall = unweighted mean of non-live, live and multi-turn. Missing categories count 0 there too.
`offline_maximum` is what either summary reaches here when every category that runs offline is 100%.

A category that did not run counts 0, with its full BFCL entry count in the live weighting, exactly as
BFCL does (it shows "N/A" but scores 0): an offline run here (no web search, memory, Java, JavaScript)
can reach at most 60% overall and 1/3 of the simple group's Java/JavaScript share is missing too.

Files, in BFCL's layout so that its own scorer (``bfcl evaluate``, `eval_runner.runner`) reads them:
``result/<model>/<group>/BFCL_v4_<category>_result.json`` (JSON lines ``{"id", "result"}``), ``score/<model>/<group>/
BFCL_v4_<category>_score.json`` (a header line with accuracy, correct and total count, then the failed entries) and
``score/data_overall.csv`` with BFCL's ``COLUMNS_OVERALL`` header. ``<model>`` is the folder of the BFCL model key
whose handler reads the results (``bfcl_model``, default ``Qwen/Qwen3-4B-Instruct-2507-FC``).

A result file's ``result`` is each raw response as BFCL's runner stores it: the handler's ``model_responses``
(`palaestra.egpo.bfcl_handler.stored_response`; for Qwen the text after ``</think>``), per turn per step for
multi-turn entries; the whole response is kept beside it as ``raw_result``. So ``bfcl evaluate`` re-scores the
model's own text with BFCL's decoder: it reproduces the run's numbers where the run decoded with ``decoder: bfcl``,
and gives BFCL's numbers for a run scored with our decoder (``palaestra``), where the two rules differ.

Decoders (`decode_calls`): ``palaestra`` (`palaestra.shared.toolcall`: one malformed block fails the whole
answer) or ``bfcl`` (BFCL's ``QwenFCHandler.decode_ast`` on the stored response: a malformed block is skipped, a
call without ``arguments`` fails the decode).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from palaestra.egpo.bfcl import require_bfcl
from palaestra.egpo.bfcl_handler import DEFAULT_MODEL, model_dir
from palaestra.shared.toolcall import ToolCall, parse_response

BFCL_VERSION = "BFCL v4 (bfcl-eval 2026.3.23)"
BFCL_V3_VERSION = "BFCL v3 (gorilla 65a1c944, 2025-07-08)"
OVERALL_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}
"""BFCL v4's group weights in the overall score (normalized to sum 1)."""
DECODERS = ("palaestra", "bfcl")
LIVE_AST = ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"]
MULTI_TURN = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]


def decode_calls(text: str, decoder: str = "palaestra") -> tuple[list[ToolCall] | None, str | None]:
    """The calls of a response under a decode rule: ``(calls, None)`` or ``(None, error)``."""
    if decoder == "palaestra":
        parsed = parse_response(text)
        return (None, parsed.error) if parsed.error else (parsed.calls, None)
    if decoder != "bfcl":
        raise ValueError(f"unknown decoder {decoder!r} (one of {DECODERS})")
    from palaestra.egpo import bfcl_handler

    model = bfcl_handler.DEFAULT_MODEL
    decoded, error = bfcl_handler.decode_ast(model, bfcl_handler.stored_response(model, text))
    if decoded is None:
        return None, error
    return [ToolCall(name, args) for call in decoded for name, args in call.items()], None


def category_size(category: str) -> int:
    """Entries of a BFCL category (BFCL's own count, used for categories that did not run)."""
    utils = require_bfcl()
    return len(utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False))


def _accuracy(scores: dict[str, tuple[int, int]]) -> Callable[[str], float]:
    """A category's accuracy (0 where it did not run)."""
    return lambda category: scores[category][0] / scores[category][1] if scores.get(category, (0, 0))[1] else 0.0


def _count(scores: dict[str, tuple[int, int]], sizes: dict[str, int] | None) -> Callable[[str], int]:
    """A category's entry count: what ran, else `sizes`, else BFCL's data."""
    return lambda category: (
        scores[category][1] if category in scores else (sizes or {}).get(category) or category_size(category)
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def bfcl_summary(scores: dict[str, tuple[int, int]], sizes: dict[str, int] | None = None) -> dict[str, float]:
    """BFCL v4's group and overall accuracies from ``{category: (correct, total)}`` (see the module docstring).

    `sizes` gives the entry count of categories that did not run (default: BFCL's data)."""

    acc, count = _accuracy(scores), _count(scores, sizes)
    simple = _mean([acc("simple_python"), acc("simple_java"), acc("simple_javascript")])
    groups = {
        "non_live": _mean([simple, acc("multiple"), acc("parallel"), acc("parallel_multiple")]),
        "live": sum(acc(c) * count(c) for c in LIVE_AST) / sum(count(c) for c in LIVE_AST),
        "irrelevance": _mean([acc("irrelevance"), acc("live_irrelevance")]),
        "multi_turn": _mean([acc(c) for c in MULTI_TURN]),
        "agentic": _mean(
            [
                _mean([acc("web_search_base"), acc("web_search_no_snippet")]),
                _mean([acc("memory_kv"), acc("memory_vector"), acc("memory_rec_sum")]),
            ]
        ),
    }
    total_weight = sum(OVERALL_WEIGHTS.values())
    overall = sum(groups[g] * w / total_weight for g, w in OVERALL_WEIGHTS.items())
    return {"overall": overall, **groups, "relevance": acc("live_relevance"), "non_live_simple": simple}


def bfcl_v3_summary(scores: dict[str, tuple[int, int]], sizes: dict[str, int] | None = None) -> dict[str, float]:
    """BFCL v3's group and overall accuracies from ``{category: (correct, total)}`` (see the module docstring)."""

    acc, count = _accuracy(scores), _count(scores, sizes)
    simple = _mean([acc("simple_python"), acc("simple_java"), acc("simple_javascript")])
    live_all = [*LIVE_AST, "live_irrelevance", "live_relevance"]
    non_live = _mean([simple, acc("multiple"), acc("parallel"), acc("parallel_multiple"), acc("irrelevance")])
    live = sum(acc(c) * count(c) for c in live_all) / sum(count(c) for c in live_all)
    multi_turn = _mean([acc(c) for c in MULTI_TURN])
    return {
        "overall": _mean([live, non_live, multi_turn]),
        "non_live": non_live,
        "live": live,
        "multi_turn": multi_turn,
        "single_turn": _mean([live, non_live]),
        "irrelevance": _mean([acc("irrelevance"), acc("live_irrelevance")]),
        "relevance": acc("live_relevance"),
    }


def offline_maximum(version: str = "v4") -> float:
    """The overall score of a run that gets every category that runs offline right (the rest count 0)."""
    from palaestra.egpo.bfcl import ALL_CATEGORIES

    perfect = {c: (1, 1) for c in ALL_CATEGORIES}
    summary = bfcl_summary if version == "v4" else bfcl_v3_summary
    return summary(perfect)["overall"]


def _group_dir(category: str) -> str:
    require_bfcl()
    from bfcl_eval.utils import get_directory_structure_by_category

    return get_directory_structure_by_category(category)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return path


def write_result_file(root: Path, category: str, results: list[dict], bfcl_model: str = DEFAULT_MODEL) -> Path:
    """BFCL's result file of one category: ``results`` are ``{"id", "result"}`` rows."""
    name = f"BFCL_v4_{category}_result.json"
    return _write_jsonl(Path(root) / "result" / model_dir(bfcl_model) / _group_dir(category) / name, results)


def write_score_file(
    root: Path, category: str, correct: int, failed: list[dict], total: int, bfcl_model: str = DEFAULT_MODEL
) -> Path:
    """BFCL's score file of one category: a header line, then the failed entries."""
    header = {"accuracy": correct / total if total else 0.0, "correct_count": correct, "total_count": total}
    name = f"BFCL_v4_{category}_score.json"
    rows = [header, *[{"valid": False, "test_category": category, **f} for f in failed]]
    return _write_jsonl(Path(root) / "score" / model_dir(bfcl_model) / _group_dir(category) / name, rows)


def _percent(value: float | None) -> str:
    return "N/A" if value is None else f"{value * 100:.2f}%"


def write_score_csv(root: Path, scores: dict[str, tuple[int, int]], model: str) -> Path:
    """``score/data_overall.csv`` with BFCL's ``COLUMNS_OVERALL`` header, shown as BFCL shows it: "N/A" for a
    category that did not run and for a group with such a member (non-live, its simple part, irrelevance),
    a number for the overall, live and multi-turn scores (where missing categories count 0)."""
    require_bfcl()
    from bfcl_eval.constants.column_headers import COLUMNS_OVERALL

    summary = bfcl_summary(scores)

    def cat(c: str) -> str:
        return _percent(scores[c][0] / scores[c][1]) if c in scores and scores[c][1] else "N/A"

    def group(name: str, members: list[str]) -> str:
        return _percent(summary[name]) if all(c in scores for c in members) else "N/A"

    simple = ["simple_python", "simple_java", "simple_javascript"]
    non_live = ["multiple", "parallel", "parallel_multiple"]
    row = [
        "1",
        _percent(summary["overall"]),
        model,
        "N/A",
        *["N/A"] * 4,  # cost and latency: not measured here
        group("non_live", simple + non_live),
        group("non_live_simple", simple),
        *[cat(c) for c in non_live],
        _percent(summary["live"]),
        *[cat(c) for c in LIVE_AST],
        _percent(summary["multi_turn"]),
        *[cat(c) for c in MULTI_TURN],
        *["N/A"] * 7,  # web search and memory: not run offline
        cat("live_relevance"),
        group("irrelevance", ["irrelevance", "live_irrelevance"]),
        *["N/A"] * 2,  # format sensitivity: not run
        "N/A",
        "N/A",
    ]
    assert len(row) == len(COLUMNS_OVERALL), (len(row), len(COLUMNS_OVERALL))
    path = Path(root) / "score" / "data_overall.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(",".join(COLUMNS_OVERALL) + "\n" + ",".join(row))
    return path


def result_row(
    entry_id: str, outputs: list[str], turn_outputs: list[list[str]] | None, bfcl_model: str = DEFAULT_MODEL
) -> dict:
    """One line of a result file from a run's raw responses: each as BFCL's runner stores it (`stored_response`)
    as ``result``, the responses themselves as ``raw_result``."""
    from palaestra.egpo.bfcl_handler import stored_response

    if turn_outputs is not None:  # multi-turn: per turn, per step
        result = [[stored_response(bfcl_model, t) for t in turn] for turn in turn_outputs]
        return {"id": entry_id, "result": result, "raw_result": turn_outputs}
    raw = outputs[-1] if outputs else ""
    return {"id": entry_id, "result": stored_response(bfcl_model, raw), "raw_result": raw}


def write_run_files(
    root: Path, records_by_category: dict[str, list[dict]], model: str, bfcl_model: str = DEFAULT_MODEL
) -> dict[str, Any]:
    """Result files, score files and the score CSV of a run (records as `palaestra.egpo.eval` builds them;
    `bfcl_model`: the BFCL model key whose handler reads the result files)."""
    scores = {}
    for category, records in records_by_category.items():
        rows = [result_row(r["id"], r["outputs"], r.get("turn_outputs"), bfcl_model) for r in records]
        write_result_file(root, category, rows, bfcl_model)
        correct = sum(bool(r["valid"]) for r in records)
        failed = [
            {"id": r["id"], "error_type": r.get("error") or r.get("multi_turn_error")}
            for r in records
            if not r["valid"]
        ]
        write_score_file(root, category, correct, failed, len(records), bfcl_model)
        scores[category] = (correct, len(records))
    csv = write_score_csv(root, scores, model)
    return {"scores": scores, "csv": csv}
