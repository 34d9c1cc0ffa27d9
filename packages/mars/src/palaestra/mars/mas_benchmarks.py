"""Question sets for the multi-agent-system harness: loaders, answer extraction, scoring.

- `load_questions(path, style)`: a user's JSONL file, one ``{"question": ..., "answer": ...}`` per line;
  ``style: aime`` checks that every answer is an integer (AIME-style), ``style: gpqa`` that every row has
  ``choices`` (2-10 options) and an answer that is a choice letter or the text of one choice (GPQA-style,
  stored as the letter); ``plain`` takes any answer.
- `builtin_questions(name)`: small sets written in code for tests and smoke runs: ``arithmetic``
  (generated), ``aime_mini`` (integer answers), ``gpqa_mini`` (multiple choice).
- `extract_answer`: ``\\boxed{...}``, ``<answer>...</answer>`` or a final "Answer: ..." line, else the
  last number; `same_answer` compares numerically when both sides are numbers, letters case-free.
- `accuracy_metrics`: accuracy with its 95% Wilson interval.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError
from palaestra.shared.jsonl import read_jsonl
from palaestra.shared.stats import wilson_interval


class QuestionStyle(StrEnum):
    plain = "plain"
    aime = "aime"
    gpqa = "gpqa"


LETTERS = "ABCDEFGHIJ"


def arithmetic_questions(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Small arithmetic problems with exact integer answers (``a op b op c``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        expr = f"{a} {op1} {b} {op2} {c}"
        out.append({"question": f"What is {expr}?", "answer": str(_evaluate(expr))})
    return out


def _evaluate(expr: str) -> int:
    """Integer arithmetic with + - * and the usual precedence (no eval of user text)."""
    tokens = expr.split()
    terms: list[int] = [int(tokens[0])]
    ops: list[str] = []
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            terms[-1] *= int(num)
        else:
            ops.append(op)
            terms.append(int(num))
    total = terms[0]
    for op, value in zip(ops, terms[1:]):
        total = total + value if op == "+" else total - value
    return total


AIME_MINI = [
    {"question": "How many positive divisors does 360 have?", "answer": "24"},
    {"question": "What is the remainder when 2^10 is divided by 7?", "answer": "2"},
    {"question": "What is the sum of the interior angles of a hexagon, in degrees?", "answer": "720"},
    {"question": "How many ways can 5 distinct books be arranged on a shelf?", "answer": "120"},
    {"question": "What is the smallest prime greater than 100?", "answer": "101"},
]
GPQA_MINI = [
    {
        "question": "Which particle carries no electric charge?",
        "choices": ["Proton", "Electron", "Neutron", "Positron"],
        "answer": "C",
    },
    {"question": "What is the SI unit of force?", "choices": ["Joule", "Newton", "Pascal", "Watt"], "answer": "B"},
    {
        "question": "Which gas makes up most of Earth's atmosphere?",
        "choices": ["Oxygen", "Argon", "Carbon dioxide", "Nitrogen"],
        "answer": "D",
    },
    {"question": "What is the pH of pure water at 25 C?", "choices": ["7", "0", "14", "1"], "answer": "A"},
]


class BuiltinSet(StrEnum):
    arithmetic = "arithmetic"
    aime_mini = "aime_mini"
    gpqa_mini = "gpqa_mini"


def builtin_questions(name: str, n: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """A question set written in code: arithmetic (n generated), aime_mini, gpqa_mini."""
    if name == "arithmetic":
        return arithmetic_questions(n, seed)
    if name == "aime_mini":
        return [dict(q) for q in AIME_MINI][:n]
    if name == "gpqa_mini":
        return [dict(q) for q in GPQA_MINI][:n]
    raise ConfigError(f"unknown built-in question set {name!r}; known: {', '.join(BuiltinSet)}")


def load_questions(path: str | Path, limit: int | None = None, style: str = "plain") -> list[dict[str, Any]]:
    """Rows of a JSONL question file, checked for `style` (plain | aime | gpqa)."""
    if style not in list(QuestionStyle):
        raise ConfigError(f"unknown question style {style!r}; known: {', '.join(QuestionStyle)}")
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"questions_file not found: {path}")
    out = []
    for lineno, row in read_jsonl(path):
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ConfigError(f"{path}:{lineno}: each line needs 'question' and 'answer'")
        out.append(_check_row(dict(row), style, f"{path}:{lineno}"))
        if limit and len(out) >= limit:
            break
    return out


def _check_row(row: dict[str, Any], style: str, where: str) -> dict[str, Any]:
    answer = str(row["answer"]).strip()
    if style == "aime" and not re.fullmatch(r"-?\d+", answer):
        raise ConfigError(f"{where}: an AIME-style answer must be an integer, got {answer!r}")
    if style == "gpqa":
        choices = row.get("choices")
        if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS):
            raise ConfigError(f"{where}: a GPQA-style row needs 'choices', a list of 2-{len(LETTERS)} options")
        if answer in [str(c) for c in choices]:
            answer = LETTERS[[str(c) for c in choices].index(answer)]
        if answer.upper() not in LETTERS[: len(choices)]:
            raise ConfigError(f"{where}: the answer {answer!r} is neither a choice letter nor one of the choices")
        answer = answer.upper()
    row["answer"] = answer
    return row


def question_text(row: dict[str, Any]) -> str:
    text = row["question"]
    if row.get("choices"):
        letters = "ABCDEFGHIJ"
        text += "\n" + "\n".join(f"{letters[i]}. {c}" for i, c in enumerate(row["choices"]))
        text += "\nAnswer with the letter of the correct choice."
    return text


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The answer a response commits to (boxed, <answer>, 'Answer:', else the last number)."""
    for pattern in (r"\\boxed\{([^{}]*)\}", r"<answer>(.*?)</answer>", r"(?im)^\s*(?:final\s+)?answer\s*[:：]\s*(.+)$"):
        found = re.findall(pattern, text, flags=re.DOTALL)
        if found:
            return found[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def same_answer(predicted: str | None, gold: str) -> bool:
    if predicted is None:
        return False
    a, b = _normalize(predicted), _normalize(gold)
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return a == b


def _normalize(text: str) -> str:
    text = text.strip().strip(".").strip()
    text = re.sub(r"^\(?([A-J])\)?$", r"\1", text)  # "(B)" -> "B"
    return text.replace(",", "").replace("$", "").lower()


def aggregate(answers: list[str | None], rule: str) -> str | None:
    if rule == "first":
        return answers[0]
    valid = [_normalize(a) for a in answers if a is not None]
    if not valid:
        return None
    counts = Counter(valid)
    best = max(counts.values())
    return next(a for a in valid if counts[a] == best)  # ties: the earliest agent's answer


def accuracy_metrics(correct: list[bool], prefix: str) -> dict[str, float]:
    """``{prefix}/accuracy`` and its 95% Wilson bounds ``_lo``/``_hi``."""
    n, k = len(correct), sum(correct)
    lo, hi = wilson_interval(k, n)
    return {f"{prefix}/accuracy": k / n if n else 0.0, f"{prefix}/accuracy_lo": lo, f"{prefix}/accuracy_hi": hi}
