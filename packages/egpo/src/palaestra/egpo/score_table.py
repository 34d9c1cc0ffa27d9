"""A markdown table of BFCL accuracies with 95% Wilson intervals, read from the score files of runs.

Each run is an ``egpo.eval`` output (or an ``egpo.train`` run's ``eval/``): its BFCL score files
``<run>/bfcl/score/<model>/<group>/BFCL_v4_<category>_score.json`` (written by
`palaestra.egpo.bfcl_results.write_score_file`; the first line holds ``correct_count`` and
``total_count``). One row per run, one column per category, each cell ``correct/n [low, high]``::

    python -m palaestra.egpo.score_table "baseline=outputs/egpo/run/baseline" "SFT=outputs/egpo/run/sft_eval" \
        --categories simple_python multiple parallel

A row may pool several runs (``LABEL=DIR1,DIR2,...``, e.g. the seeds of one arm): their counts are summed
and the interval is over the pooled answers. Runs of one model on the same entries are not independent
draws of entries, so such an interval says how well the pooled answers are known, not the entries.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from palaestra.shared.stats import wilson_interval


def read_counts(run: str | Path, category: str) -> tuple[int, int]:
    """(correct, total) of `category` in the BFCL score files under ``<run>/bfcl/score``."""
    root = Path(run) / "bfcl" / "score"
    found = sorted(root.glob(f"*/*/BFCL_v4_{category}_score.json"))
    if not found:
        raise FileNotFoundError(f"no BFCL score file for {category!r} under {root}")
    if len(found) > 1:
        raise ValueError(f"several BFCL score files for {category!r} under {root}: {[str(p) for p in found]}")
    with found[0].open() as f:
        header = json.loads(f.readline())
    return int(header["correct_count"]), int(header["total_count"])


def cell(correct: int, total: int) -> str:
    """``correct/total [low, high]``, the 95% Wilson interval to two decimals."""
    low, high = wilson_interval(correct, total)
    return f"{correct}/{total} [{low:.2f}, {high:.2f}]"


def pooled_counts(runs: list[str | Path], category: str) -> tuple[int, int]:
    """(correct, total) of `category` summed over `runs`."""
    counts = [read_counts(run, category) for run in runs]
    return sum(c for c, _ in counts), sum(t for _, t in counts)


def table(runs: list[tuple[str, str | Path | list[str | Path]]], categories: list[str]) -> str:
    """The markdown table: a row per ``(label, run directory or directories to pool)``, a column per category."""
    lines = [f"| model | {' | '.join(categories)} |", "| --- |" + " --- |" * len(categories)]
    for label, run in runs:
        pooled = run if isinstance(run, list) else [run]
        lines.append(f"| {label} | {' | '.join(cell(*pooled_counts(pooled, c)) for c in categories)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "runs", nargs="+", help="LABEL=DIR[,DIR...]: a row label and egpo.eval output directories (several: pooled)"
    )
    parser.add_argument("--categories", nargs="+", default=["simple_python", "multiple", "parallel"])
    args = parser.parse_args(argv)
    runs: list[tuple[str, str | Path | list[str | Path]]] = []
    for item in args.runs:
        label, sep, run = item.partition("=")
        dirs: list[str | Path] = list(run.split(","))
        if not sep or not label or not all(dirs):
            parser.error(f"expected LABEL=DIR[,DIR...], got {item!r}")
        runs.append((label, dirs))
    try:
        print(table(runs, args.categories))
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"score_table: {err}\n")


if __name__ == "__main__":
    main()
