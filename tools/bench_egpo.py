"""Benchmark: the `fc_binary` reward vs BFCL's official `ast_checker`, on the same BFCL answers.

fc_binary parses the response text (our format) and matches the calls; the official checker gets the
already-decoded calls. Both score every ground truth of simple_python, multiple, parallel and
parallel_multiple plus a wrong-value perturbation of each. Prints answers/s of each and the ratio, each the
median [min-max] of 5 runs.

    .venv/bin/python tools/bench_egpo.py
"""

from __future__ import annotations

import time

from benchstats import REPEATS, spread

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
    n = len(items)
    rates: dict[str, list[float]] = {"ours": [], "official": [], "ratio": []}
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        ours = [fc_binary(task, text)[0] for task, _, text, _ in items]
        t1 = time.perf_counter()
        official = [official_ast_check(task.tools, dec, task.ground_truth, cat)["valid"] for task, cat, _, dec in items]
        t2 = time.perf_counter()
        rates["ours"].append(n / (t1 - t0))
        rates["official"].append(n / (t2 - t1))
        rates["ratio"].append((t2 - t1) / (t1 - t0))
    agree = sum((o == 1.0) == v for o, v in zip(ours, official)) / len(items)
    print(f"answers: {n}, agreement {agree:.2%}; median [min-max] of {REPEATS} runs")
    print(f"fc_binary (parse + match): {spread(rates['ours'])} answers/s")
    print(f"BFCL ast_checker (decoded calls): {spread(rates['official'])} answers/s")
    print(f"ratio fc_binary / official: {spread(rates['ratio'], '.2f')}x")


if __name__ == "__main__":
    main()
