"""Scoring for MARS's multi-agent-system table: math by equivalence, multiple choice by its letter, pass@1 over k.

- `visible`: a response without its ``<think>`` span (what another agent may see, and what is scored);
- `is_correct`: a math answer by Hugging Face's ``math-verify`` (``\\frac{1}{2}`` equals ``0.5``), a
  multiple-choice one by the exact letter it commits to (`choice_letter`);
- `pass_at_1`: per question the share of its k samples that are right, averaged over the questions, with the
  95% t interval over the questions (the questions are the sample; k only makes each question's share finer).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from palaestra.shared.stats import t_mean_interval

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def visible(text: str) -> str:
    """`text` without its thinking: closed ``<think>`` spans removed; an unclosed one (a response cut inside
    its thinking) leaves nothing."""
    text = _THINK.sub("", text)
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    if "</think>" in text:  # the template opened the span in the prompt (Qwen3's generation prompt)
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


_LETTER_PATTERNS = (
    r"\\boxed\{\s*\(?([A-J])\)?\s*\}",
    r"<answer>\s*\(?([A-J])\)?\s*</answer>",
    r"(?i:answer)\s*(?:is|:)?\s*[:：]?\s*\**\(?([A-J])\)?(?![A-Za-z])",
    r"^\s*\(?([A-J])\)?\s*[.)]?\s*$",
)


def choice_letter(text: str) -> str | None:
    """The choice letter a response commits to: the last boxed, <answer> or "answer is X" letter, or a reply
    that is a letter alone; None if it names none."""
    for pattern in _LETTER_PATTERNS:
        found = re.findall(pattern, text, flags=re.MULTILINE)
        if found:
            return found[-1].upper()
    return None


def math_equal(gold: str, response: str) -> bool:
    """Whether `response`'s final answer equals `gold` (math-verify: LaTeX, numbers, sets; ``\\boxed`` first)."""
    from math_verify import parse, verify

    target = parse(gold if "$" in gold or "\\boxed" in gold else f"${gold}$")
    return bool(target) and bool(verify(target, parse(response)))


def is_correct(row: dict[str, Any], response: str) -> bool:
    """Whether `response` (a final reply, its thinking included or not) answers `row` right."""
    text = visible(response)
    if row.get("choices"):
        return choice_letter(text) == row["answer"]
    return math_equal(str(row["answer"]), text)


def pass_at_1(correct: Sequence[Sequence[bool]]) -> dict[str, float]:
    """``correct[q][j]``: sample j of question q. pass@1 (the mean over questions of each one's share right), its
    95% t interval over the questions, and the counts."""
    shares = [sum(c) / len(c) for c in correct if len(c)]
    if not shares:
        return {"pass_at_1": 0.0, "pass_at_1_lo": 0.0, "pass_at_1_hi": 0.0, "questions": 0.0, "samples": 0.0}
    mean = sum(shares) / len(shares)
    lo, hi = t_mean_interval(shares) if len(shares) > 1 else (mean, mean)
    samples = sum(len(c) for c in correct) / len(shares)
    return {
        "pass_at_1": mean,
        "pass_at_1_lo": max(0.0, lo),
        "pass_at_1_hi": min(1.0, hi),
        "questions": float(len(shares)),
        "samples": samples,
    }
