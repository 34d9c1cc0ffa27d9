"""LLM-as-judge filter: a verified sample is scored by a judge model and dropped under a threshold.

HardGen and FunReason-MT keep a sample only when a judge model agrees that its requests determine its
calls; replay verification cannot see that (a call can replay and still be a guess from the user's words).
The judge (``roles.judge: llm``, its own model under ``roles.models.judge``) reads every user turn with
the calls the assistant is trained to make, or what it should say instead (`render_turns`), and answers a
score from 1 to 10 (``prompts/judge.txt``). A score under ``roles.judge_threshold`` drops the sample as
``judge:low_score``; an answer without a score as ``judge:no_score``. Kept samples carry the score in
``verdict.judge_score``; ``stats.json`` -> ``judge`` counts judged, passed and dropped samples.
"""

from __future__ import annotations

import re

from palaestra.datagen.llm_roles import first_json_object, prompt


def render_turns(row: dict) -> str:
    """Each user turn of `row` and what answers it: its calls, or the question / refusal that is right there."""
    lines = []
    for i, turn in enumerate(row["turns"], 1):
        kind = turn["kind"]
        if kind == "func_added":
            lines.append(f"Turn {i}: (a function becomes available: {turn.get('missing')})")
        else:
            who = "the user answers the assistant's question" if kind == "param_given" else "user"
            lines.append(f"Turn {i} ({who}): {turn['query']}")
        if kind == "miss_param":
            lines.append(f"  right answer: ask the user for the {turn.get('missing')} (no call)")
        elif kind == "miss_func":
            lines.append("  right answer: say that no available function can do it (no call)")
        else:
            lines.append(f"  calls: {'; '.join(turn['ground_truth']) or '(none)'}")
    return "\n".join(lines)


def judge_messages(row: dict) -> list[dict]:
    return [{"role": "user", "content": prompt("judge", turns=render_turns(row))}]


def parse_score(text: str) -> float | None:
    """The score of a judge's answer (1-10): a JSON object's ``score``, else "score: N"; None if neither."""
    obj = first_json_object(text)
    value = obj.get("score") if obj else None
    if value is None:
        found = re.search(r"score\W{0,4}(\d+(?:\.\d+)?)", text.split("</think>")[-1], re.I)
        value = found[1] if found else None
    try:
        score = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return score if score is not None and 1 <= score <= 10 else None


class LLMJudge:
    name = "llm"
    role = "judge"

    def __init__(self, llm, threshold: float):
        self.llm = llm
        self.threshold = threshold
        self.last_drop: str | None = None

    def check(self, row: dict):
        """The filter's verdict (`role_registry.Filter`): dropped without a score or under the threshold."""
        from palaestra.datagen.role_registry import FilterVerdict

        score = self.score(row)
        if score is None:
            return FilterVerdict("judge:no_score", {"judge_score": None})
        return FilterVerdict("judge:low_score" if score < self.threshold else None, {"judge_score": score})

    def score(self, row: dict) -> float | None:
        """The judge's score of `row`, or None (``last_drop`` says why)."""
        score = parse_score(self.llm.chat(judge_messages(row), role=self.role))
        if score is None:
            self.llm.drop(self, "no_score")
        return score


def llm_judge(ctx) -> LLMJudge:
    """The judge filter's factory (`role_registry`): one per worker, on the roles' shared LLM counter."""
    return LLMJudge(ctx.counter, ctx.cfg.judge_threshold)
