"""BFCL's scoreboard: the summary formula by hand and by BFCL's own code, result files that BFCL's own scorer
reads, and the two decode rules."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from palaestra.egpo.bfcl import CHECKER_MODEL_NAME
from palaestra.egpo.bfcl_results import bfcl_summary, decode_calls, write_run_files
from palaestra.egpo.eval import build_envs, run_oracle

pytestmark = pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")

SCORES = {  # (correct, total)
    "simple_python": (30, 40),
    "multiple": (10, 20),
    "parallel": (5, 20),
    "live_simple": (8, 10),
    "live_multiple": (15, 30),
    "live_parallel": (1, 4),
    "live_relevance": (3, 4),
    "irrelevance": (18, 20),
    "live_irrelevance": (6, 10),
    "multi_turn_base": (2, 10),
    "multi_turn_miss_func": (1, 10),
}


def _first_row(path) -> dict:
    with open(path) as f:
        return next(csv.DictReader(f))


SIZES = {"live_parallel_multiple": 6}  # a live category that did not run: 0 correct out of BFCL's count


def test_summary_formula_by_hand():
    # non-live: simple = mean(simple_python 0.75, simple_java 0, simple_javascript 0) = 0.25;
    #   mean(0.25, multiple 0.5, parallel 0.25, parallel_multiple 0) = 0.25
    # live: weighted by count over the four live AST categories, live_relevance left out:
    #   (8 + 15 + 1 + 0) / (10 + 30 + 4 + 6) = 24 / 50 = 0.48
    # irrelevance: mean(0.9, 0.6) = 0.75; multi-turn: mean(0.2, 0.1, 0, 0) = 0.075; agentic: 0
    # overall: 0.1 * 0.25 + 0.1 * 0.48 + 0.1 * 0.75 + 0.3 * 0.075 + 0.4 * 0 = 0.1705
    summary = bfcl_summary(SCORES, SIZES)
    assert summary["non_live"] == pytest.approx(0.25)
    assert summary["live"] == pytest.approx(0.48)
    assert summary["irrelevance"] == pytest.approx(0.75)
    assert summary["multi_turn"] == pytest.approx(0.075)
    assert summary["agentic"] == 0.0
    assert summary["relevance"] == pytest.approx(0.75)
    assert summary["overall"] == pytest.approx(0.1705)


def test_summary_and_csv_equal_bfcls_own_leaderboard_code(tmp_path):
    from bfcl_eval.eval_checker.eval_runner_helper import generate_leaderboard_csv

    from palaestra.egpo.bfcl_results import write_score_csv

    table = {CHECKER_MODEL_NAME: {c: {"accuracy": k / n, "total_count": n} for c, (k, n) in SCORES.items()}}
    generate_leaderboard_csv(table, tmp_path)
    theirs = _first_row(tmp_path / "data_overall.csv")
    ours_path = write_score_csv(tmp_path / "ours", SCORES, "m")
    ours = _first_row(ours_path)
    assert float(theirs["Overall Acc"].rstrip("%")) / 100 == pytest.approx(bfcl_summary(SCORES)["overall"], abs=5e-5)
    columns = [c for c in theirs if c not in ("Rank", "Model", "Model Link", "Organization", "License")]
    for column in columns:  # every score column as BFCL shows it ("N/A" where it shows "N/A")
        assert ours[column] == theirs[column], (column, ours[column], theirs[column])


def test_bfcls_own_scorer_reads_our_result_files(tmp_path):
    from bfcl_eval.eval_checker.eval_runner import runner

    categories = ["simple_python", "parallel", "irrelevance", "live_relevance", "multi_turn_base"]
    records = {}
    for category in categories:
        envs, ids = build_envs(category, limit=4)
        # a mixed result set: entries 0 and 2 answered right, 1 and 3 wrong
        results = [run_oracle([env], wrong=i % 2 == 1)[0] for i, env in enumerate(envs)]
        records[category] = []
        for i, env, r in zip(ids, envs, results):
            record = {"id": i, "outputs": r["outputs"], "valid": r["reward"] == 1.0}
            if hasattr(env, "responses"):
                record["turn_outputs"] = env.responses
            records[category].append(record)
    ours = write_run_files(tmp_path, records, model="oracle")["scores"]  # files of the default handler's folder
    assert all(ours[c] == (2, 4) for c in categories), ours
    score_dir = tmp_path / "bfcl_score"
    score_dir.mkdir()
    runner([CHECKER_MODEL_NAME], categories, tmp_path / "result", score_dir, allow_missing=True)
    for category in categories:
        (path,) = score_dir.glob(f"{CHECKER_MODEL_NAME}/*/BFCL_v4_{category}_score.json")
        header = json.loads(path.read_text().splitlines()[0])
        assert (header["correct_count"], header["total_count"]) == ours[category], category
    theirs = _first_row(score_dir / "data_overall.csv")
    mine = _first_row(tmp_path / "score" / "data_overall.csv")
    assert theirs["Overall Acc"] == mine["Overall Acc"]


def test_decode_rules_differ_on_a_malformed_block():
    good = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    text = f"<think>t</think>\n{good}\n<tool_call>\n{{broken\n</tool_call>"
    calls, error = decode_calls(text, "palaestra")
    assert calls is None and "not valid JSON" in error  # ours: the whole answer fails
    calls, error = decode_calls(text, "bfcl")
    assert error is None and [(c.name, c.arguments) for c in calls] == [("f", {"x": 1})]  # BFCL: skipped
    # BFCL's decode_ast indexes call["arguments"]: a call without it fails the decode (ours reads it as f())
    calls, error = decode_calls('<tool_call>\n{"name": "f"}\n</tool_call>', "bfcl")
    assert calls is None and "KeyError" in error
    assert decode_calls(good, "palaestra")[0] == decode_calls(good, "bfcl")[0]
    with pytest.raises(ValueError, match="unknown decoder"):
        decode_calls(good, "lenient")


def test_bfcl_fc_prompt_sends_the_entry_as_bfcl_does():
    from palaestra.egpo.tasks import SYSTEM_PROMPT

    (ours,), _ = build_envs("simple_python", limit=1)
    (theirs,), _ = build_envs("simple_python", limit=1, prompt="bfcl_fc")
    ours.reset(0), theirs.reset(0)
    assert ours.observe("agent")[0] == {"role": "system", "content": SYSTEM_PROMPT}
    messages = theirs.observe("agent")
    assert all(m["role"] != "system" for m in messages)  # BFCL's FC mode adds no system prompt
    assert theirs.tools("agent") == theirs.task.tools  # BFCL's own function docs ("type": "dict" and all)
    assert ours.tools("agent")[0]["function"]["parameters"]["type"] == "object"
    (mt,), _ = build_envs("multi_turn_base", limit=1, prompt="bfcl_fc", decoder="bfcl")
    mt.reset(0)
    assert mt.observe("agent")[0]["role"] == "user" and mt.decoder == "bfcl"
    mt.close()


def _rescore_cases():
    """Issue 26's three cases on simple_python entries, as text around each entry's ground-truth calls."""
    from palaestra.egpo.tasks import canonical_calls

    def blocks(calls, sep="\n"):
        return "".join(f"<tool_call>{sep}{json.dumps(c)}{sep}</tool_call>" for c in calls)

    return {
        "compact": lambda calls: "<think>t</think>" + blocks(calls, sep=""),
        "unclosed_think": lambda calls: "<think>I will call it.\n" + blocks(calls),
        "good_plus_malformed": lambda calls: (
            "<think>t</think>\n" + blocks(calls) + "\n<tool_call>\n{broken\n</tool_call>"
        ),
    }, canonical_calls


# (our count with decoder palaestra, with decoder bfcl) out of 10, as the issue measured them under each rule
EXPECTED = {"compact": (10, 0), "unclosed_think": (0, 10), "good_plus_malformed": (0, 10)}


# each (case, decoder) on its own AST category's first 10 entries, so that BFCL's runner scores all six at once
CATEGORY = {
    ("compact", "palaestra"): "simple_python",
    ("compact", "bfcl"): "multiple",
    ("unclosed_think", "palaestra"): "parallel",
    ("unclosed_think", "bfcl"): "parallel_multiple",
    ("good_plus_malformed", "palaestra"): "live_simple",
    ("good_plus_malformed", "bfcl"): "live_multiple",
}


def test_bfcls_own_runner_rescores_our_raw_files_with_bfcls_decoder(tmp_path):
    """The result files hold the raw responses: BFCL's runner reproduces a run scored with ``decoder: bfcl``, and
    gives BFCL's numbers (not ours) for a run scored with our decoder where the rules differ (issue 36: before, the
    files held our decoded calls re-rendered and BFCL only re-checked our decoding)."""
    from bfcl_eval.eval_checker.eval_runner import runner

    from palaestra.egpo.eval import score_single_turn
    from palaestra.egpo.tasks import load_bfcl

    cases, canonical_calls = _rescore_cases()
    expected, records = {}, {}
    for (case, decoder), category in CATEGORY.items():
        expected[category] = (EXPECTED[case][decoder == "bfcl"], 10)  # our run's count
        bfcl_count = (EXPECTED[case][1], 10)  # what BFCL's decoder makes of the same raw text
        records[category] = []
        for task in load_bfcl(category, 10):
            text = cases[case](canonical_calls(task.ground_truth, task.tools))
            verdict = score_single_turn(task, text, decoder)
            record = {"id": task.id, "outputs": [text], "valid": verdict["valid"], "error": verdict["error"]}
            records[category].append(record)
        # the result file of this category is written with this decoder (one call per decoder's categories)
        ours = write_run_files(tmp_path / category, {category: records[category]}, model="m")
        assert ours["scores"][category] == expected[category], (case, decoder)
        expected[category] = bfcl_count
        for path in (tmp_path / category / "result").rglob("*.json"):  # gather the files under one root
            target = tmp_path / "all" / path.relative_to(tmp_path / category)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    (tmp_path / "bfcl_score").mkdir()
    runner(
        [CHECKER_MODEL_NAME], list(records), tmp_path / "all" / "result", tmp_path / "bfcl_score", allow_missing=True
    )
    for category in records:
        (path,) = (tmp_path / "bfcl_score").glob(f"{CHECKER_MODEL_NAME}/*/BFCL_v4_{category}_score.json")
        header = json.loads(path.read_text().splitlines()[0])
        assert (header["correct_count"], header["total_count"]) == expected[category], category


def test_v3_summary_by_hand():
    # non-live: simple = mean(0.75, 0, 0) = 0.25; mean(0.25, multiple 0.5, parallel 0.25, parallel_multiple 0,
    #   irrelevance 0.9) = 1.9 / 5 = 0.38
    # live: weighted over live AST + live_irrelevance + live_relevance:
    #   (8 + 15 + 1 + 0 + 6 + 3) / (10 + 30 + 4 + 6 + 10 + 4) = 33 / 64 = 0.515625
    # multi-turn: 0.075; single-turn: (0.38 + 0.515625) / 2 = 0.4478125
    # overall: (0.38 + 0.515625 + 0.075) / 3 = 0.323541666...
    from palaestra.egpo.bfcl_results import bfcl_v3_summary

    v3 = bfcl_v3_summary(SCORES, SIZES)
    assert v3["non_live"] == pytest.approx(0.38)
    assert v3["live"] == pytest.approx(33 / 64)
    assert v3["multi_turn"] == pytest.approx(0.075)
    assert v3["single_turn"] == pytest.approx((0.38 + 33 / 64) / 2)
    assert v3["overall"] == pytest.approx((0.38 + 33 / 64 + 0.075) / 3)
    assert v3["irrelevance"] == pytest.approx(0.75) and v3["relevance"] == pytest.approx(0.75)


def _bfcl_v3_overall(table: dict) -> dict[str, float]:
    """BFCL v3's aggregation as its code computes it: ``generate_leaderboard_csv`` of gorilla's
    ``berkeley-function-call-leaderboard/bfcl_eval/eval_checker/eval_runner_helper.py`` at commit 65a1c944 (the
    last before "BFCL V4 Release"), its lines transcribed, run on bfcl-eval's own ``get_category_score``,
    ``calculate_weighted_accuracy`` and ``calculate_unweighted_accuracy`` (identical in both versions). v3's
    category names ``simple``, ``java``, ``javascript`` are v4's ``simple_python``, ``simple_java``,
    ``simple_javascript``; the others are unchanged."""
    from bfcl_eval.eval_checker.eval_runner_helper import (
        calculate_unweighted_accuracy,
        calculate_weighted_accuracy,
        get_category_score,
    )

    value = {k: dict(v) for k, v in table.items()}
    python_simple_ast_non_live = get_category_score(value, "simple_python")
    python_multiple_ast_non_live = get_category_score(value, "multiple")
    python_parallel_ast_non_live = get_category_score(value, "parallel")
    python_parallel_multiple_ast_non_live = get_category_score(value, "parallel_multiple")
    java_simple_ast_non_live = get_category_score(value, "simple_java")
    javascript_simple_ast_non_live = get_category_score(value, "simple_javascript")
    irrelevance_non_live = get_category_score(value, "irrelevance")
    simple_ast_non_live = calculate_unweighted_accuracy(
        [python_simple_ast_non_live, java_simple_ast_non_live, javascript_simple_ast_non_live]
    )
    overall_accuracy_non_live = calculate_unweighted_accuracy(
        [
            simple_ast_non_live,
            python_multiple_ast_non_live,
            python_parallel_ast_non_live,
            python_parallel_multiple_ast_non_live,
            irrelevance_non_live,
        ],
        display_na_if_category_missing=False,
    )
    python_simple_ast_live = get_category_score(value, "live_simple")
    python_multiple_ast_live = get_category_score(value, "live_multiple")
    python_parallel_ast_live = get_category_score(value, "live_parallel")
    python_parallel_multiple_ast_live = get_category_score(value, "live_parallel_multiple")
    irrelevance_live = get_category_score(value, "live_irrelevance")
    relevance_live = get_category_score(value, "live_relevance")
    overall_accuracy_live = calculate_weighted_accuracy(
        [
            python_simple_ast_live,
            python_multiple_ast_live,
            python_parallel_ast_live,
            python_parallel_multiple_ast_live,
            irrelevance_live,
            relevance_live,
        ],
        display_na_if_category_missing=False,
    )
    overall_accuracy_multi_turn = calculate_unweighted_accuracy(
        [get_category_score(value, c) for c in ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                                "multi_turn_long_context")],
        display_na_if_category_missing=False,
    )  # fmt: skip
    single_turn_ast = calculate_unweighted_accuracy([overall_accuracy_live, overall_accuracy_non_live])
    total_irrelevance = calculate_unweighted_accuracy([irrelevance_non_live, irrelevance_live])
    total_overall_accuracy = calculate_unweighted_accuracy(
        [overall_accuracy_live, overall_accuracy_non_live, overall_accuracy_multi_turn],
        display_na_if_category_missing=False,
    )
    return {
        "overall": total_overall_accuracy["accuracy"],
        "non_live": overall_accuracy_non_live["accuracy"],
        "live": overall_accuracy_live["accuracy"],
        "multi_turn": overall_accuracy_multi_turn["accuracy"],
        "single_turn": single_turn_ast["accuracy"],
        "irrelevance": total_irrelevance["accuracy"],
        "relevance": relevance_live["accuracy"],
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_v3_summary_equals_bfcls_v3_code(seed):
    """Random score tables over a random subset of the categories (the rest did not run: 0 with BFCL's entry
    count), scored by `bfcl_v3_summary` and by BFCL v3's own aggregation."""
    import random

    from palaestra.egpo.bfcl import ALL_CATEGORIES
    from palaestra.egpo.bfcl_results import bfcl_v3_summary

    rng = random.Random(seed)
    scores = {}
    for category in ALL_CATEGORIES:
        if rng.random() < 0.7:
            total = rng.randint(1, 60)
            scores[category] = (rng.randint(0, total), total)
    table = {c: {"accuracy": k / n, "total_count": n} for c, (k, n) in scores.items()}
    theirs, ours = _bfcl_v3_overall(table), bfcl_v3_summary(scores)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-15), key


def test_offline_maximum_of_each_version():
    from palaestra.egpo.bfcl_results import offline_maximum

    # v4: non-live (1/3 + 3) / 4, live 1, irrelevance 1, multi-turn 1, agentic 0 -> 0.1 * 5/6 + 0.1 + 0.1 + 0.3
    assert offline_maximum("v4") == pytest.approx(0.1 * 5 / 6 + 0.5)
    # v3: non-live (1/3 + 4) / 5 = 13/15, live 1, multi-turn 1 -> (13/15 + 2) / 3
    assert offline_maximum("v3") == pytest.approx((13 / 15 + 2) / 3)
