"""Benchmark: the `fc_binary` reward vs BFCL's official `ast_checker`, on the same BFCL answers.

fc_binary parses the response text (our format) and matches the calls; the official checker gets the
already-decoded calls. Both score every ground truth of simple_python, multiple, parallel and
parallel_multiple plus a wrong-value perturbation of each. Prints answers/s of each and the ratio.
"""

from __future__ import annotations

import time

from palaestra.egpo.bfcl import official_ast_check
from palaestra.egpo.reward import fc_binary
from palaestra.egpo.tasks import canonical_calls, load_bfcl
from palaestra.shared.toolcall import ToolCall, format_calls


def cases():
    out = []
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple"):
        for task in load_bfcl(category):
            calls = canonical_calls(task.ground_truth, task.tools)
            for variant in (calls, [{**calls[0], "name": calls[0]["name"] + "_x"}] + calls[1:]):
                text = format_calls([ToolCall(c["name"], c["arguments"]) for c in variant], thinking="t")
                out.append((task, category, text, [{c["name"]: c["arguments"]} for c in variant]))
    return out


def main() -> None:
    items = cases()
    best = {}
    for _ in range(3):
        t0 = time.perf_counter()
        ours = [fc_binary(task, text)[0] for task, _, text, _ in items]
        t1 = time.perf_counter()
        official = [official_ast_check(task.tools, dec, task.ground_truth, cat)["valid"] for task, cat, _, dec in items]
        t2 = time.perf_counter()
        best["ours"] = min(best.get("ours", 1e9), t1 - t0)
        best["official"] = min(best.get("official", 1e9), t2 - t1)
    agree = sum((o == 1.0) == v for o, v in zip(ours, official)) / len(items)
    n = len(items)
    print(f"answers: {n}, agreement {agree:.2%}")
    print(f"fc_binary (parse + match): {n / best['ours']:,.0f} answers/s")
    print(f"BFCL ast_checker (decoded calls): {n / best['official']:,.0f} answers/s")
    print(f"ratio fc_binary / official: {best['official'] / best['ours']:.2f}x")


if __name__ == "__main__":
    main()
