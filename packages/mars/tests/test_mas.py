"""Multi-agent debate harness: question sets, answer extraction, aggregation, the job."""

from __future__ import annotations

import json
import random
import re

import pytest

from palaestra.mars.mas import (
    MASConfig,
    aggregate,
    arithmetic_questions,
    extract_answer,
    load_questions,
    run_debate,
    same_answer,
)
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.llm.base import Completion


def test_arithmetic_answers_match_python():
    for q in arithmetic_questions(50, seed=3):
        expr = re.fullmatch(r"What is (.+)\?", q["question"]).group(1)
        assert int(q["answer"]) == eval(expr)  # Python's own evaluator as the reference


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so the result is \\boxed{42}.", "42"),
        ("<think>hmm 3</think><answer> 17 </answer>", "17"),
        ("Reasoning...\nAnswer: B", "B"),
        ("first 3 then 1,234", "1,234"),
        ("no idea", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_same_answer_and_majority():
    assert same_answer("1,234", "1234") and same_answer("(B)", "b") and same_answer("3.0", "3")
    assert not same_answer(None, "3") and not same_answer("4", "3")
    assert aggregate(["3", "4", "4"], "majority") == "4"
    assert aggregate(["5", "4", None], "majority") == "5"  # tie -> earliest agent
    assert aggregate(["5", "4", "4"], "first") == "5"
    assert aggregate([None, None], "majority") is None


class NoisyAgents:
    """A scripted backend: right with probability p in round 1; later rounds adopt the others' majority."""

    def __init__(self, answers: dict[str, str], p: float, seed: int = 0):
        self.answers, self.p, self.rng = answers, p, random.Random(seed)

    def chat(self, conversations, params=None, tools=None):
        out = []
        for conv in conversations:
            question = conv[0]["content"].split("\n")[0]
            if len(conv) == 1:
                gold = int(self.answers[question])
                text = f"<answer>{gold if self.rng.random() < self.p else gold + self.rng.randint(1, 3)}</answer>"
            else:
                shown = re.findall(r"<answer>(.*?)</answer>", conv[-1]["content"])
                own = re.findall(r"<answer>(.*?)</answer>", conv[-2]["content"])
                text = f"<answer>{aggregate(shown + own, 'majority')}</answer>"
            out.append(Completion(text, [], None, [], "stop"))
        return out


def test_debate_beats_single_with_independent_noisy_agents():
    questions = arithmetic_questions(300, seed=1)
    client = NoisyAgents({q["question"]: q["answer"] for q in questions}, p=0.6)
    records = run_debate(client, questions, MASConfig(num_agents=3, rounds=2))
    single = sum(r["single_correct"] for r in records) / len(records)
    debate = sum(r["debate_correct"] for r in records) / len(records)
    assert 0.5 < single < 0.7
    assert debate > single + 0.03  # majority of 3 independent p=0.6 voters: 0.648 in expectation


def test_load_questions_errors(tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "x"}\n')
    with pytest.raises(ConfigError, match="needs 'question' and 'answer'"):
        load_questions(bad)
    bad.write_text("{oops\n")
    with pytest.raises(ConfigError, match="q.jsonl:1: not valid JSON"):
        load_questions(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_questions(tmp_path / "missing.jsonl")


@pytest.mark.slow
def test_mas_job_on_tiny_model(tracking, tmp_path):
    import mlflow

    qfile = tmp_path / "gpqa_style.jsonl"
    rows = [
        {"question": "Which is a noble gas?", "choices": ["Neon", "Iron"], "answer": "A"},
        {"question": "What is 2 + 2?", "answer": "4"},
    ]
    qfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        {
            "job": "mars.mas",
            "questions_file": str(qfile),
            "num_agents": 2,
            "rounds": 2,
            "max_tokens": 12,
            "llm": {"model": "tiny", "device": "cpu"},
            "tracking": vars(tracking),
        }
    )
    out = run_job(cfg)
    run = mlflow.tracking.MlflowClient(tracking.uri).get_run(out["run_id"])
    for key in ("mas/gpqa_style/single/accuracy", "mas/gpqa_style/debate/accuracy", "mas/gpqa_style/questions"):
        assert key in run.data.metrics
    assert run.data.metrics["mas/gpqa_style/questions"] == 2
