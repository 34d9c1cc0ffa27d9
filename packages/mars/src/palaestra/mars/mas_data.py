"""The seven benchmarks of MARS's multi-agent-system table, read from local copies of their official releases.

Nothing downloads: ``path`` points at the files as their authors ship them.

- ``gsm8k``: openai/grade-school-math ``test.jsonl``: ``question``, ``answer`` ending in ``#### N``.
- ``math500``: HuggingFaceH4/MATH-500 ``test.jsonl``: ``problem``, ``answer`` (LaTeX), ``unique_id``.
- ``aqua``: deepmind/AQuA ``test.json`` (one JSON object a line): ``question``, ``options`` (``"A)21"``, ...),
  ``correct`` (a letter).
- ``aime24``: HuggingFaceH4/aime_2024 (``data/train-*.parquet`` or JSONL): ``problem``, ``answer``
  (``Problem``/``Answer`` also read).
- ``amc23``: math-ai/amc23 (parquet or JSONL): ``question``, ``answer``.
- ``gpqa_diamond``: the official ``gpqa_diamond.csv`` (Idavidrein/gpqa): ``Question``, ``Correct Answer``,
  ``Incorrect Answer 1-3``. Its choices are shuffled per seed (`shuffle_choices`), as MARS shuffles them.
- ``mmlu_stem``: hendrycks/test ``data/test/<subject>_test.csv`` (no header: question, A, B, C, D, letter),
  the 18 subjects of MMLU's STEM category (`MMLU_STEM`).

A row is ``{"id", "question", "answer", "choices"?}``: a math answer as written, a choice answer as its letter.
`question_prompt` puts a row to a model.
"""

from __future__ import annotations

import csv
import json
import random
from enum import StrEnum
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError

LETTERS = "ABCDEFGHIJ"


class Benchmark(StrEnum):
    gsm8k = "gsm8k"
    math500 = "math500"
    aqua = "aqua"
    aime24 = "aime24"
    amc23 = "amc23"
    gpqa_diamond = "gpqa_diamond"
    mmlu_stem = "mmlu_stem"


MMLU_STEM = (
    "abstract_algebra",
    "astronomy",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "electrical_engineering",
    "elementary_mathematics",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_mathematics",
    "high_school_physics",
    "high_school_statistics",
    "machine_learning",
)
"""MMLU's STEM subjects (hendrycks/test ``categories.py``: physics, chemistry, biology, computer science, math,
engineering)."""


def _records(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL, JSON (array or lines), parquet or CSV file, or of every such file in a directory."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".json", ".parquet"))
        if not files:
            raise ConfigError(f"{path}: no .jsonl, .json or .parquet files in it")
        return [row for f in files for row in _records(f)]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _field(row: dict[str, Any], *names: str, where: str) -> Any:
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    raise ConfigError(f"{where}: no field {' or '.join(repr(n) for n in names)} (fields: {', '.join(row)})")


def _number(value: Any) -> str:
    """An answer as a clean number string: ``27.0`` -> ``27``, ``"1,000"`` -> ``1000``."""
    text = str(value).strip().replace(",", "")
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() else text


def _math_rows(rows, benchmark: str, question: tuple[str, ...], answer: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        where = f"{benchmark} row {i}"
        gold = _field(row, *answer, where=where)
        if benchmark == Benchmark.gsm8k:
            if "####" not in str(gold):
                raise ConfigError(f"{where}: a GSM8K answer ends in '#### N', got {str(gold)[-40:]!r}")
            gold = str(gold).rsplit("####", 1)[1]
        gold = _number(gold) if benchmark != Benchmark.math500 else str(gold).strip()
        rid = row.get("unique_id") or row.get("id") or row.get("ID") or i
        out.append({"id": str(rid), "question": str(_field(row, *question, where=where)), "answer": gold})
    return out


def _aqua(rows) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        where = f"aqua row {i}"
        options = [str(o) for o in _field(row, "options", where=where)]
        choices = [o.split(")", 1)[1].strip() if ")" in o[:3] else o for o in options]
        letter = str(_field(row, "correct", where=where)).strip().upper()
        if letter not in LETTERS[: len(choices)]:
            raise ConfigError(f"{where}: 'correct' must be one of the option letters, got {letter!r}")
        question = str(_field(row, "question", where=where))
        out.append({"id": str(i), "question": question, "choices": choices, "answer": letter})
    return out


def _gpqa(rows) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        where = f"gpqa_diamond row {i}"
        right = str(_field(row, "Correct Answer", where=where)).strip()
        wrong = [str(_field(row, f"Incorrect Answer {k}", where=where)).strip() for k in (1, 2, 3)]
        rid = row.get("Record ID") or str(i)
        # unshuffled: the correct answer first; `shuffle_choices` orders them per seed
        question = str(_field(row, "Question", where=where)).strip()
        out.append({"id": str(rid), "question": question, "choices": [right, *wrong], "answer": "A"})
    return out


def _mmlu(path: Path) -> list[dict[str, Any]]:
    folder = path / "test" if (path / "test").is_dir() else path
    out = []
    for subject in MMLU_STEM:
        file = folder / f"{subject}_test.csv"
        if not file.is_file():
            raise ConfigError(f"mmlu_stem: {file} is missing (the official data/test/<subject>_test.csv layout)")
        with file.open(newline="", encoding="utf-8") as f:
            for i, line in enumerate(csv.reader(f)):
                if len(line) != 6 or line[5].strip().upper() not in "ABCD":
                    raise ConfigError(f"{file}:{i + 1}: expected question, A, B, C, D, answer letter")
                row = {"id": f"{subject}/{i}", "question": line[0], "choices": line[1:5]}
                out.append({**row, "answer": line[5].strip().upper()})
    return out


def load_benchmark(name: str, path: str | Path, limit: int = 0) -> list[dict[str, Any]]:
    """The rows of benchmark `name` read from its release at `path` (the first `limit`; 0: all)."""
    if name not in list(Benchmark):
        raise ConfigError(f"unknown benchmark {name!r}; known: {', '.join(Benchmark)}")
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{name}: {path} not found (a local copy of the official release; nothing downloads)")
    if name == Benchmark.mmlu_stem:
        rows = _mmlu(path)
    elif name == Benchmark.aqua:
        rows = _aqua(_records(path))
    elif name == Benchmark.gpqa_diamond:
        rows = _gpqa(_records(path))
    else:
        question = ("question", "problem", "Problem", "Question")
        rows = _math_rows(_records(path), name, question, ("answer", "Answer"))
    return rows[:limit] if limit else rows


def shuffle_choices(row: dict[str, Any], seed: int) -> dict[str, Any]:
    """`row` with its choices in an order drawn from (seed, row id), the answer letter following its choice."""
    if not row.get("choices"):
        return row
    order = list(range(len(row["choices"])))
    random.Random(f"{seed}/{row['id']}").shuffle(order)
    right = LETTERS.index(row["answer"])
    return {**row, "choices": [row["choices"][j] for j in order], "answer": LETTERS[order.index(right)]}


def question_prompt(row: dict[str, Any]) -> str:
    """The question as the agents get it: choices lettered, and where the final answer goes."""
    if row.get("choices"):
        lines = "\n".join(f"{LETTERS[i]}) {c}" for i, c in enumerate(row["choices"]))
        return f"{row['question']}\n\n{lines}\n\nGive the letter of the correct choice as your final answer."
    return f"{row['question']}\n\nPut your final answer within \\boxed{{}}."
