"""Multi-agent debate harness: question sets, answer extraction, aggregation, the job."""

from __future__ import annotations

import json
import random
import re

import pytest

from palaestra.mars.mas import MASConfig, run_debate, run_group_chat
from palaestra.mars.mas_benchmarks import (
    aggregate,
    arithmetic_questions,
    builtin_questions,
    extract_answer,
    load_questions,
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


def test_aime_and_gpqa_style_files_are_checked(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"question": "x", "answer": "1.5"}) + "\n")
    with pytest.raises(ConfigError, match="AIME-style answer must be an integer"):
        load_questions(f, style="aime")
    f.write_text(json.dumps({"question": "x", "choices": ["a", "b"], "answer": "b"}) + "\n")
    assert load_questions(f, style="gpqa")[0]["answer"] == "B"  # the choice text becomes its letter
    f.write_text(json.dumps({"question": "x", "choices": ["a", "b"], "answer": "C"}) + "\n")
    with pytest.raises(ConfigError, match="neither a choice letter nor one of the choices"):
        load_questions(f, style="gpqa")
    f.write_text(json.dumps({"question": "x", "answer": "A"}) + "\n")
    with pytest.raises(ConfigError, match="needs 'choices'"):
        load_questions(f, style="gpqa")
    for name in ("aime_mini", "gpqa_mini"):
        rows = builtin_questions(name)
        assert rows and all("question" in r and "answer" in r for r in rows)
    assert all(r["answer"].lstrip("-").isdigit() for r in builtin_questions("aime_mini"))


class Scripted:
    """Records every call's conversations and seed; answers with the seed so calls can be told apart."""

    def __init__(self):
        self.calls = []

    def chat(self, conversations, params=None, tools=None):
        self.calls.append((conversations, params.seed))
        return [Completion(f"<answer>{params.seed}</answer>", [], None, [], "stop") for _ in conversations]


def test_group_chat_speaks_in_fixed_order_and_ends_on_the_solver():
    client = Scripted()
    questions = [{"question": "What is 1 + 1?", "answer": "2"}]
    records = run_group_chat(client, questions, MASConfig(rounds=2, seed=0))
    # solver (round 0), critic (round 0), solver (round 1): three calls, seeds agent + 100 * round
    assert [seed for _, seed in client.calls] == [0, 1, 100]
    assert [s for s, _ in records[0]["chat"]] == ["solver", "critic", "solver"]
    critic_view = client.calls[1][0][0]
    assert critic_view[-1]["role"] == "user" and critic_view[-1]["content"].startswith("[solver]: <answer>0</answer>")
    last_solver_view = client.calls[2][0][0]
    assert [m["role"] for m in last_solver_view] == ["user", "assistant", "user"]
    assert records[0]["group_chat_answer"] == "100"  # the solver's last answer is final


def test_debate_agents_diverge_through_the_openai_backend(tiny_server):
    """A served model honours the seed: one seed for all agents gave identical answers; each agent has its own."""
    from palaestra.shared.llm import LLMConfig, SamplingParams, make_client

    client = make_client(LLMConfig(backend="openai", model="tiny", base_url=tiny_server))
    conv = [{"role": "user", "content": "What is 3 + 4?"}]
    same = [client.chat([conv], SamplingParams(temperature=1.0, max_tokens=16, seed=7))[0].text for _ in range(2)]
    assert same[0] == same[1]  # the server is deterministic per seed: shared seeds would make agents copies
    questions = arithmetic_questions(3, seed=2)
    records = run_debate(client, questions, MASConfig(num_agents=3, rounds=1, temperature=1.0, max_tokens=16))
    for r in records:
        answers = [turns[0] for turns in r["agent_answers"]]
        assert len(set(answers)) > 1, answers


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
            "trained_llm": {"model": "tiny", "device": "cpu", "seed": 1},  # another checkpoint, side by side
            "tracking": vars(tracking),
        }
    )
    out = run_job(cfg)
    run = mlflow.tracking.MlflowClient(tracking.uri).get_run(out["run_id"])
    m = run.data.metrics
    for model in ("base", "trained"):
        for system in ("single", "debate", "group_chat"):
            key = f"mas/gpqa_style/{model}/{system}/accuracy"
            assert key in m and m[f"{key}_lo"] <= m[key] <= m[f"{key}_hi"]
    assert m["mas/gpqa_style/questions"] == 2
