"""Independent check of our re-implementation of BFCL's value rules (`palaestra.egpo.ast_match`, behind the named
leniency ``fc_binary_lenient_decode``) against BFCL's official ``ast_checker`` on BFCL's own data. (``fc_binary``
itself is BFCL's decoder and checker since issue 36; its corpus test is test_bfcl_decoding.py.)

1. Every ground truth of the six categories, written in our response format and decoded by our
   parser, scores 1.0 wherever the official checker accepts it (BFCL ships a handful of ground
   truths that its own checker rejects: a required parameter whose only accepted value is "absent";
   those are listed, and must be rejected by both).
2. Systematic perturbations of each ground truth: our verdict must agree with the official
   checker's on at least 99% of cases. The table and every disagreement are printed (``pytest -s``).
"""

from __future__ import annotations

import copy
import json

import pytest

from palaestra.egpo.bfcl import official_ast_check, require_bfcl
from palaestra.egpo.reward import fc_binary
from palaestra.egpo.reward import fc_binary_lenient_decode as fc_rule
from palaestra.egpo.tasks import FCTask, canonical_calls, load_bfcl, tool_doc
from palaestra.shared.toolcall import ToolCall, format_calls

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple"]
PERTURBATIONS = [
    "ground_truth",
    "wrong_value",
    "missing_required",
    "extra_arg",
    "wrong_name",
    "dropped_call",
    "extra_call",
    "reordered",
]

pytestmark = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("bfcl_eval"), reason="bfcl-eval not installed (see egpo README)"
)


def _wrong(value):
    """A value of the same type that no BFCL answer list accepts (for scalars)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7
    if isinstance(value, float):
        return value + 7.25
    if isinstance(value, str):
        return value + " qqq"
    return None


def perturb(kind: str, calls: list[dict], task: FCTask) -> list[dict] | None:
    """The perturbed call list, or None when the perturbation does not apply to this entry."""
    calls = copy.deepcopy(calls)
    docs = {tool_doc(t)["name"]: tool_doc(t) for t in task.tools}
    if kind == "ground_truth":
        return calls
    if kind == "wrong_value":
        for call in calls:
            for param, value in call["arguments"].items():
                wrong = _wrong(value)
                if wrong is not None:
                    call["arguments"][param] = wrong
                    return calls
        return None
    if kind == "missing_required":
        for call in calls:
            required = (docs.get(call["name"], {}).get("parameters") or {}).get("required") or []
            for param in required:
                if param in call["arguments"]:
                    del call["arguments"][param]
                    return calls
        return None
    if kind == "extra_arg":
        calls[0]["arguments"]["unrequested_option"] = 1
        return calls
    if kind == "wrong_name":
        calls[-1]["name"] += "_v2"
        return calls
    if kind == "dropped_call":
        return calls[:-1]
    if kind == "extra_call":
        return calls + [copy.deepcopy(calls[0])]
    if kind == "reordered":
        return calls[::-1] if len(calls) > 1 and calls[::-1] != calls else None
    raise ValueError(kind)


@pytest.fixture(scope="module")
def agreement():
    require_bfcl()
    rows, disagreements, unsatisfiable = {}, [], []
    for category in CATEGORIES:
        for task in load_bfcl(category):
            base = canonical_calls(task.ground_truth, task.tools)
            for kind in PERTURBATIONS:
                calls = perturb(kind, base, task)
                if calls is None:
                    continue
                # both checkers see the same values: what our parser decodes from the response text
                text = format_calls([ToolCall(c["name"], c["arguments"]) for c in calls], thinking="reasoning")
                decoded = json.loads(json.dumps([{c["name"]: c["arguments"]} for c in calls]))
                official = bool(official_ast_check(task.tools, decoded, task.ground_truth, category)["valid"])
                ours, info = fc_rule(task, text)
                row = rows.setdefault((category, kind), [0, 0, 0])
                row[0] += 1
                row[1] += (ours == 1.0) == official
                row[2] += official
                if (ours == 1.0) != official:
                    disagreements.append((task.id, kind, official, ours, info["reason"]))
                if kind == "ground_truth" and not official:
                    unsatisfiable.append((task.id, info["reason"]))
    _print_table(rows, disagreements, unsatisfiable)
    return rows, disagreements, unsatisfiable


def _print_table(rows, disagreements, unsatisfiable):
    print("\nfc_binary_lenient_decode (ast_match) vs BFCL ast_checker (bfcl-eval 2026.3.23)")
    print(f"{'category':<20}{'perturbation':<18}{'cases':>7}{'agree':>7}{'official ok':>13}{'agreement':>11}")
    for (category, kind), (n, agree, ok) in rows.items():
        print(f"{category:<20}{kind:<18}{n:>7}{agree:>7}{ok:>13}{agree / n:>11.2%}")
    total = sum(r[0] for r in rows.values())
    agree = sum(r[1] for r in rows.values())
    print(f"{'TOTAL':<38}{total:>7}{agree:>7}{'':>13}{agree / total:>11.2%}")
    print(f"disagreements ({len(disagreements)}):")
    for item in disagreements:
        print("  ", item)
    print(f"ground truths BFCL's own checker rejects ({len(unsatisfiable)}):")
    for item in unsatisfiable:
        print("  ", item)


def test_every_ground_truth_scores_one(agreement):
    rows, disagreements, unsatisfiable = agreement
    gt_disagreements = [d for d in disagreements if d[1] == "ground_truth"]
    assert not gt_disagreements, gt_disagreements
    n_ground_truths = sum(rows[(c, "ground_truth")][0] for c in CATEGORIES)
    assert n_ground_truths > 2000
    assert len(unsatisfiable) <= 10  # BFCL's own defects, listed above; both checkers reject them


def test_perturbations_agree_with_official_checker(agreement):
    rows, disagreements, _ = agreement
    total = sum(r[0] for r in rows.values())
    agree = sum(r[1] for r in rows.values())
    assert total > 10000
    assert agree / total >= 0.99, f"agreement {agree / total:.2%}"
    # the perturbations really do break answers: the official checker rejects most of them
    for kind in ("wrong_value", "missing_required", "extra_arg", "wrong_name", "dropped_call", "extra_call"):
        n, _, official_ok = [sum(r[i] for (c, k), r in rows.items() if k == kind) for i in range(3)]
        assert official_ok < 0.05 * n, (kind, official_ok, n)


def test_text_around_the_calls_scores_zero_strict_and_official_lenient():
    """Chatty wrappers around BFCL ground truths: 0 under the strict reward; the lenient one still agrees with
    BFCL's checker on the values (first 60 entries of each category, three wrappers each)."""
    from palaestra.egpo.reward import fc_binary_lenient

    require_bfcl()
    wrappers = [
        lambda calls: f"<think>reasoning</think>\nSure! Here are the calls:\n{calls}",
        lambda calls: f"<think>reasoning</think>\n{calls}\nLet me know if you need more.",
        lambda calls: f"<think>reasoning</think>\n{calls.replace('</tool_call>', '</tool_call> then', 1)}",
    ]
    cases = agree = 0
    for category in CATEGORIES:
        for task in load_bfcl(category, limit=60):
            calls = canonical_calls(task.ground_truth, task.tools)
            blocks = format_calls([ToolCall(c["name"], c["arguments"]) for c in calls])
            decoded = json.loads(json.dumps([{c["name"]: c["arguments"]} for c in calls]))
            official = bool(official_ast_check(task.tools, decoded, task.ground_truth, category)["valid"])
            for i, wrap in enumerate(wrappers):
                if i == 2 and len(calls) < 2:
                    continue
                text = wrap(blocks)
                assert fc_binary(task, text)[0] == 0.0, (task.id, text)
                cases += 1
                agree += (fc_binary_lenient(task, text)[0] == 1.0) == official
    assert cases > 800
    assert agree == cases
