"""MARS's results table from two `mars.eval` result files: base vs trained, relative change, 95% intervals.

    python packages/mars/scripts/eval_table.py BASE.json TRAINED.json

A `mars.train` run of the paper config logs ``eval_results_step00000.json`` (the base model) and one per later
evaluation (``eval_results_step00200.json`` at the end) as MLflow artifacts; a `mars.eval` run logs
``eval_results.json``.
"""

from __future__ import annotations

import argparse

from palaestra.mars.eval_table import compare, format_table, load_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("trained")
    args = parser.parse_args()
    print(format_table(compare(load_records(args.base), load_records(args.trained))))


if __name__ == "__main__":
    main()
