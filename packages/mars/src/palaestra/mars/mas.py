"""The ``mars.mas`` job: a multi-agent debate over any LLM backend, against a single agent.

MARS reports that self-play in games transfers to multi-agent systems
(debate, AutoGen-style) on AIME and GPQA. This harness measures it: N agents
answer a question independently (round 1); in each of R-1 further rounds every
agent sees the other agents' latest answers and gives an updated one (Du et
al., 2023, "Improving Factuality and Reasoning through Multiagent Debate").
The final answers are aggregated (``majority``: most common extracted answer,
ties to the earliest agent; ``first``: agent 0's final answer). The single-agent
baseline is agent 0's first-round answer, so both come from the same samples.

Questions come from a user's JSONL file (``{"question": ..., "answer": ...}``,
optional ``"choices": [...]`` rendered as lettered options, GPQA-style) or
from `arithmetic_questions`, generated in code. Answers are extracted from
``\\boxed{...}``, ``<answer>...</answer>`` or a final "Answer: ..." line,
else the last number, and compared numerically when both sides are numbers.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError, JobConfig
from palaestra.shared.jobs import job
from palaestra.shared.jsonl import read_jsonl
from palaestra.shared.llm import LLMConfig
from palaestra.shared.stats import wilson_interval
from palaestra.shared.tracking import Tracker, scratch_dir

AGGREGATIONS = ("majority", "first")
INSTRUCTION = "Think step by step, then give your final answer as <answer>ANSWER</answer>."


@dataclass
class MASConfig(JobConfig):
    """Multi-agent debate vs a single agent on a question set."""

    job: str = "mars.mas"
    llm: LLMConfig = field(default_factory=LLMConfig)
    """The model every agent runs (e.g. a MARS-trained checkpoint vs its base model)."""
    questions_file: str | None = None
    """JSONL with ``question`` and ``answer`` (and optional ``choices``); None: generated arithmetic."""
    num_questions: int = 20
    """Questions to use (the first ones of the file; or how many arithmetic questions to generate)."""
    num_agents: int = 3
    rounds: int = 2
    """Debate rounds (1: independent answers, aggregated)."""
    aggregation: str = "majority"
    """majority | first."""
    temperature: float = 0.6
    max_tokens: int = 512


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


def load_questions(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"questions_file not found: {path}")
    out = []
    for lineno, row in read_jsonl(path):
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ConfigError(f"{path}:{lineno}: each line needs 'question' and 'answer'")
        out.append(row)
        if limit and len(out) >= limit:
            break
    return out


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


def debate_prompt(question: str, others: list[str]) -> str:
    shown = "\n\n".join(f"One agent's solution:\n```{o}```" for o in others)
    return (
        f"These are the solutions to the problem from other agents:\n\n{shown}\n\n"
        "Using the reasoning from other agents as additional advice, can you give an updated answer? "
        f"Examine your solution and that of other agents step by step. {INSTRUCTION}"
    )


def run_debate(client, questions: list[dict[str, Any]], cfg: MASConfig) -> list[dict[str, Any]]:
    """Every question debated at once (one batched call per agent-round)."""
    from palaestra.shared.llm import SamplingParams

    convs = [
        [[{"role": "user", "content": f"{question_text(q)}\n\n{INSTRUCTION}"}] for _ in range(cfg.num_agents)]
        for q in questions
    ]
    history: list[list[list[str]]] = [[[] for _ in range(cfg.num_agents)] for _ in questions]
    for rnd in range(cfg.rounds):
        if rnd > 0:
            for qi in range(len(questions)):
                for ai in range(cfg.num_agents):
                    others = [history[qi][aj][-1] for aj in range(cfg.num_agents) if aj != ai]
                    convs[qi][ai].append({"role": "user", "content": debate_prompt(questions[qi]["question"], others)})
        flat = [convs[qi][ai] for qi in range(len(questions)) for ai in range(cfg.num_agents)]
        params = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed * 1000 + rnd)
        texts = [c.text for c in client.chat(flat, params)]
        for k, text in enumerate(texts):
            qi, ai = divmod(k, cfg.num_agents)
            convs[qi][ai].append({"role": "assistant", "content": text})
            history[qi][ai].append(text)
    records = []
    for qi, q in enumerate(questions):
        first = [extract_answer(history[qi][ai][0]) for ai in range(cfg.num_agents)]
        final = [extract_answer(history[qi][ai][-1]) for ai in range(cfg.num_agents)]
        decided = aggregate(final, cfg.aggregation)
        records.append(
            {
                "question": q["question"],
                "answer": q["answer"],
                "single_answer": first[0],
                "single_correct": same_answer(first[0], str(q["answer"])),
                "debate_answer": decided,
                "debate_correct": same_answer(decided, str(q["answer"])),
                "agent_answers": [history[qi][ai] for ai in range(cfg.num_agents)],
            }
        )
    return records


def accuracy_metrics(records: list[dict[str, Any]], prefix: str) -> dict[str, float]:
    n = len(records)
    out: dict[str, float] = {f"{prefix}/questions": float(n)}
    for system in ("single", "debate"):
        k = sum(r[f"{system}_correct"] for r in records)
        lo, hi = wilson_interval(k, n)
        out.update(
            {
                f"{prefix}/{system}/accuracy": k / n if n else 0.0,
                f"{prefix}/{system}/accuracy_lo": lo,
                f"{prefix}/{system}/accuracy_hi": hi,
            }
        )
    out[f"{prefix}/debate_minus_single"] = out[f"{prefix}/debate/accuracy"] - out[f"{prefix}/single/accuracy"]
    return out


@job("mars.mas", MASConfig)
def mas_job(cfg: MASConfig, tracker: Tracker) -> dict:
    """Multi-agent debate (N agents, R rounds, aggregation) vs a single agent: accuracy on a question set."""
    from palaestra.shared.llm import make_client

    if cfg.aggregation not in AGGREGATIONS:
        raise ConfigError(f"aggregation: unknown rule {cfg.aggregation!r}; known: {', '.join(AGGREGATIONS)}")
    if cfg.num_agents < 1 or cfg.rounds < 1:
        raise ConfigError("num_agents and rounds must be at least 1")
    if cfg.questions_file:
        questions = load_questions(cfg.questions_file, cfg.num_questions)
        dataset = Path(cfg.questions_file).stem
    else:
        questions, dataset = arithmetic_questions(cfg.num_questions, cfg.seed), "arithmetic"
    client = make_client(cfg.llm)
    records = run_debate(client, questions, cfg)
    metrics = accuracy_metrics(records, f"mas/{dataset}")
    tracker.log_metrics(metrics)
    out = scratch_dir() / "mas_transcripts.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    tracker.log_artifact(out)
    print(
        f"{dataset}: single {metrics[f'mas/{dataset}/single/accuracy']:.3f} "
        f"debate({cfg.num_agents}x{cfg.rounds}, {cfg.aggregation}) {metrics[f'mas/{dataset}/debate/accuracy']:.3f}",
        flush=True,
    )
    return {
        "single_accuracy": metrics[f"mas/{dataset}/single/accuracy"],
        "debate_accuracy": metrics[f"mas/{dataset}/debate/accuracy"],
    }
