"""MARS's MAS table: the seven loaders on small files in each official layout, scoring, pass_at_1, MAD and AutoGen
against MASLab's rules (scripted agents), and a rehearsal of the whole table on `tiny`."""

from __future__ import annotations

import csv
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from palaestra.mars.mas_data import MMLU_STEM, load_benchmark, question_prompt, shuffle_choices
from palaestra.mars.mas_scoring import choice_letter, is_correct, pass_at_1, visible
from palaestra.mars.mas_systems import TERMINATE, run_autogen, run_mad
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.llm.base import Completion


def write_releases(root):
    """Two questions of each benchmark, in the layout its authors ship."""
    (root / "gsm8k").mkdir()
    gsm = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
           {"question": "Half of 2,000?", "answer": "2000 / 2 = 1000\n#### 1,000"}]  # fmt: skip
    (root / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm))
    (root / "math500").mkdir()
    math = [{"problem": "What is $1/2$ as a fraction?", "solution": "...", "answer": "\\frac{1}{2}",
             "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"},
            {"problem": "Compute $2+3$.", "solution": "...", "answer": "5", "subject": "Prealgebra", "level": 1,
             "unique_id": "test/prealgebra/2.json"}]  # fmt: skip
    (root / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in math))
    (root / "aqua").mkdir()
    aqua = [{"question": "2 + 19?", "options": ["A)21", "B)22", "C)23", "D)24", "E)25"], "rationale": "",
             "correct": "A"},
            {"question": "10 / 2?", "options": ["A)2", "B)5", "C)8", "D)10", "E)20"], "rationale": "",
             "correct": "B"}]  # fmt: skip
    (root / "aqua" / "test.json").write_text("".join(json.dumps(r) + "\n" for r in aqua))
    (root / "aime24" / "data").mkdir(parents=True)
    aime = {"id": [60, 61], "problem": ["Find 6 * 7.", "Find 100 - 1."], "solution": ["", ""],
            "answer": ["42", "099"], "url": ["", ""], "year": ["2024", "2024"]}  # fmt: skip
    pq.write_table(pa.table(aime), root / "aime24" / "data" / "train-00000-of-00001.parquet")
    (root / "amc23").mkdir()
    amc = {"id": [0, 1], "question": ["What is 3^3?", "What is 1/4 + 1/4?"], "answer": [27.0, 0.5], "url": ["", ""]}
    pq.write_table(pa.table(amc), root / "amc23" / "test-00000-of-00001.parquet")
    (root / "gpqa").mkdir()
    head = ["Pre-Revision Question", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
            "Incorrect Answer 3", "Record ID"]  # fmt: skip
    with (root / "gpqa" / "gpqa_diamond.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        w.writerow(["", "Which gas is noble?", "Neon", "Nitrogen", "Oxygen", "Hydrogen", "rec1"])
        w.writerow(["", "Spin of an electron?", "1/2", "1", "0", "3/2", "rec2"])
    (root / "mmlu" / "data" / "test").mkdir(parents=True)
    for subject in [*MMLU_STEM, "philosophy"]:
        with (root / "mmlu" / "data" / "test" / f"{subject}_test.csv").open("w", newline="") as f:
            csv.writer(f).writerow([f"A {subject} question?", "w", "x", "y", "z", "C"])
    return {
        "gsm8k": root / "gsm8k" / "test.jsonl",
        "math500": root / "math500" / "test.jsonl",
        "aqua": root / "aqua" / "test.json",
        "aime24": root / "aime24",
        "amc23": root / "amc23",
        "gpqa_diamond": root / "gpqa" / "gpqa_diamond.csv",
        "mmlu_stem": root / "mmlu" / "data",
    }


def test_loaders_read_each_official_layout(tmp_path):
    paths = write_releases(tmp_path)
    answers = {name: [r["answer"] for r in load_benchmark(name, path)] for name, path in paths.items()}
    assert answers["gsm8k"] == ["7", "1000"]
    assert answers["math500"] == ["\\frac{1}{2}", "5"]
    assert answers["aqua"] == ["A", "B"]
    assert answers["aime24"] == ["42", "99"] and answers["amc23"] == ["27", "0.5"]
    assert answers["gpqa_diamond"] == ["A", "A"]  # unshuffled: the correct answer first
    assert len(answers["mmlu_stem"]) == 18  # the STEM subjects, philosophy left out
    aqua = load_benchmark("aqua", paths["aqua"])[1]
    assert aqua["choices"] == ["2", "5", "8", "10", "20"]
    assert "B) 5" in question_prompt(aqua) and "\\boxed" in question_prompt(load_benchmark("gsm8k", paths["gsm8k"])[0])
    assert len(load_benchmark("mmlu_stem", paths["mmlu_stem"], limit=3)) == 3
    with pytest.raises(ConfigError, match="not found"):
        load_benchmark("gsm8k", tmp_path / "nowhere.jsonl")
    with pytest.raises(ConfigError, match="unknown benchmark 'gsm9k'"):
        load_benchmark("gsm9k", paths["gsm8k"])


def test_gpqa_choices_shuffled_per_seed_the_answer_following(tmp_path):
    row = load_benchmark("gpqa_diamond", write_releases(tmp_path)["gpqa_diamond"])[0]
    orders = set()
    for seed in range(12):
        shuffled = shuffle_choices(row, seed)
        assert shuffled["choices"]["ABCD".index(shuffled["answer"])] == "Neon"
        assert sorted(shuffled["choices"]) == sorted(row["choices"])
        orders.add(tuple(shuffled["choices"]))
        assert shuffle_choices(row, seed) == shuffled  # a seed fixes the order
    assert len(orders) > 3


def test_scoring_math_by_equivalence_and_choices_by_letter():
    half = {"answer": "\\frac{1}{2}"}
    assert is_correct(half, "So the answer is \\boxed{0.5}.") and is_correct(half, "\\boxed{\\dfrac{2}{4}}")
    assert not is_correct(half, "\\boxed{0.25}")
    assert not is_correct({"answer": "7"}, "<think>it is 7</think>The answer is \\boxed{8}")  # thinking unscored
    mc = {"answer": "C", "choices": ["a", "b", "c", "d"]}
    assert is_correct(mc, "The answer is (C).") and is_correct(mc, "\\boxed{C}")
    assert not is_correct(mc, "The answer is (B).") and not is_correct(mc, "I do not know")
    assert choice_letter("the answer is a bit unclear") is None
    assert visible("<think>secret</think> shown") == "shown" and visible("<think>cut off") == ""


def test_pass_at_1_averages_samples_then_questions():
    correct = [[True, True, False, False], [True, True, True, True], [False, False, False, True]]
    shares = [0.5, 1.0, 0.25]
    out = pass_at_1(correct)
    assert out["pass_at_1"] == pytest.approx(sum(shares) / 3) and out["samples"] == 4
    lo, hi = stats.t.interval(0.95, 2, loc=sum(shares) / 3, scale=stats.sem(shares))
    assert (out["pass_at_1_lo"], out["pass_at_1_hi"]) == pytest.approx((max(0, lo), min(1, hi)))


class Scripted:
    """A backend that answers each conversation by a rule on its messages; records what every agent saw."""

    def __init__(self, reply):
        self.reply, self.seen = reply, []

    def chat(self, conversations, params=None, tools=None):
        self.seen += [list(c) for c in conversations]  # as sent (the systems extend them afterwards)
        return [Completion(self.reply(c), [1], None, [1], "stop") for c in conversations]

    def close(self):
        pass


def _role(conv) -> str:
    system = conv[0]["content"] if conv[0]["role"] == "system" else ""
    if system.startswith("You are the moderator"):
        return "judge" if "candidates" in conv[1]["content"] else "moderator"
    if system.startswith("You are a debater"):
        return "negative" if "You disagree" in conv[1]["content"] else "affirmative"
    return "assistant" if system else "proxy"


def test_mad_moderator_stops_early_and_the_judge_decides_after_three_rounds():
    def reply(conv):
        role = _role(conv)
        if role == "moderator":  # question 0 decided in round 2; question 1 never
            decided = "Q0" in conv[0]["content"] and conv[-1]["content"].startswith("The second")
            return json.dumps({"Whether there is a preference": "Yes", "debate_answer": "42" if decided else ""})
        if role == "judge":
            return '```json\n{"Reason": "r", "debate_answer": "7"}\n```'
        return f"<think>private {role}</think>I say {role}"

    client = Scripted(reply)
    out = run_mad(client, ["Q0: what?", "Q1: what?"], lambda call: None, rounds=3)
    assert out[0]["response"] == "42" and out[0]["rounds"] == 2 and not out[0]["judged"]
    assert out[1]["response"] == "7" and out[1]["rounds"] == 3 and out[1]["judged"]
    moderators = [c for c in client.seen if _role(c) == "moderator" and "Q1" in c[0]["content"]]
    assert len(moderators) == 3  # at most 3 rounds
    assert not any("private" in m["content"] for c in client.seen for m in c)  # thinking never shown
    negative_first = next(c for c in client.seen if _role(c) == "negative")
    assert negative_first[1]["content"].startswith("I say affirmative") and "disagree" in negative_first[1]["content"]


def test_autogen_ends_on_terminate_or_after_three_replies():
    def reply(conv):
        if _role(conv) == "proxy":
            return "Please double-check." + (f" {TERMINATE}" if "P1" in conv[0]["content"] else "")
        n = sum(m["role"] == "assistant" for m in conv)
        done = "P0" in conv[1]["content"] and n == 1
        return f"<think>hmm</think>The final answer is \\boxed{{{n}}}" + (f" {TERMINATE}" if done else "")

    client = Scripted(reply)
    out = run_autogen(client, ["P0", "P1", "P2"], lambda call: None, turns=3)
    assert [o["turns"] for o in out] == [2, 1, 3]  # P0: the assistant ends; P1: the proxy ends; P2: the cap
    assert out[2]["response"].endswith("\\boxed{2}") and TERMINATE in out[0]["response"]
    proxies = [c for c in client.seen if _role(c) == "proxy"]
    assert proxies[0][0] == {"role": "assistant", "content": "P0"} and proxies[0][-1]["role"] == "user"
    assert not any("<think>" in m["content"] for c in client.seen for m in c)


@pytest.mark.slow  # about 50 s on a loaded 2-core machine
def test_mas_table_rehearsal_on_tiny(tracking, tmp_path):
    import mlflow

    paths = write_releases(tmp_path)
    benchmarks = [{"name": n, "path": str(p), "limit": 1} for n, p in paths.items() if n in ("gsm8k", "gpqa_diamond")]
    cfg = load_config(
        {
            "job": "mars.mas",
            "systems": [],
            "llm": {"model": "tiny", "device": "cpu"},
            "trained_llm": {"model": "tiny", "device": "cpu", "seed": 1},
            "table": {"benchmarks": benchmarks, "samples": 2, "max_tokens": 4, "mad_rounds": 2, "autogen_turns": 2},
            "tracking": vars(tracking),
        }
    )
    out = run_job(cfg)
    m = mlflow.tracking.MlflowClient(tracking.uri).get_run(out["run_id"]).data.metrics
    for model in ("base", "trained"):
        for bench in ("gsm8k", "gpqa_diamond"):
            for system in ("mad", "autogen"):
                key = f"mas/{bench}/{model}/{system}/pass_at_1"
                assert m[f"{key}_lo"] <= m[key] <= m[f"{key}_hi"] and m[f"mas/{bench}/{model}/{system}/samples"] == 2
    with pytest.raises(ConfigError, match="needs a path"):
        load_config({"job": "mars.mas", "table": {"benchmarks": [{"name": "aime24"}]}})
    assert re.search(r"did you mean 'autogen'", _error({"job": "mars.mas", "table": {"systems": ["autogne"]}}))


def _error(data) -> str:
    try:
        load_config(data)
    except ConfigError as e:
        return str(e)
    return ""


def test_paper_table_config_runs_marss_systems_on_the_seven_benchmarks():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[3] / "experiments" / "mars" / "mas_paper.yaml")
    names = [b.name for b in cfg.table.benchmarks]
    assert names == ["gsm8k", "math500", "aqua", "aime24", "amc23", "gpqa_diamond", "mmlu_stem"]
    assert cfg.table.systems == ["mad", "autogen"] and cfg.systems == []
    assert (cfg.table.mad_rounds, cfg.table.autogen_turns) == (3, 3)  # MASLab's max_round, max_turn
    t = cfg.table  # Qwen3's card, thinking mode
    assert (t.temperature, t.top_p, t.top_k, t.max_tokens) == (0.6, 0.95, 20, 32768)
    assert cfg.llm.backend == cfg.trained_llm.backend == "openai"


def test_plan_counts_the_tables_requests(tmp_path):
    from palaestra.shared.plan import plan_config

    paths = write_releases(tmp_path)
    cfg = load_config(
        {
            "job": "mars.mas",
            "systems": [],
            "trained_llm": {"model": "tiny"},
            "table": {
                "benchmarks": [{"name": "gsm8k", "path": str(paths["gsm8k"])}, {"name": "aime24", "path": "absent"}],
                "samples": 2,
                "max_tokens": 100,
            },
        }
    )
    text, fits = plan_config(cfg)
    # gsm8k: 2 questions counted, x k 2 x 2 models; MAD 3..11 a sample (3 rounds + judge), AutoGen 1..5
    assert "gsm8k (2 questions, counted) x k=2      mad: 24-88 requests" in text
    assert "aime24 (30 questions, official size) x k=2  autogen: 120-600 requests" in text
    total = 2 * 2 * (2 + 30) * (3 + 1), 2 * 2 * (2 + 30) * (11 + 5)
    assert f"total: {total[0]}-{total[1]} requests, at most {total[1] * 100:,} generated tokens" in text and fits
