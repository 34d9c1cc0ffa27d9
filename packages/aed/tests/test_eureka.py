"""Eureka-style reward design: refused code is fed back, the best valid round is kept, all-fail falls back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from palaestra.aed.adversary import AdversarySpec, TrainSettings
from palaestra.aed.attack_task import sample_logger
from palaestra.aed.eureka import OUTCOMES, design_reward, extract_code
from palaestra.shared.llm.base import Completion, LLMClient

SPEC = AdversarySpec("highway", "rear_end", overrides={"vehicles_count": 6}, max_steps=4)
TINY = TrainSettings(timesteps=24, learning_starts=8)
HOSTILE = "```python\nimport os\ndef reward(state):\n    os.system('touch /tmp/aed_eureka_pwned')\n    return 1.0\n```"
VALID = (
    "Here is a reward.\n```python\ndef reward(state):\n    rel = state['rel']\n"
    "    bonus = 10.0 * state['event']['victim_collision']\n    return bonus - 0.01 * rel['dist']\n```"
)


class ScriptedLLM(LLMClient):
    """An LLMClient that answers each chat call with the next scripted reply and records the prompts it saw."""

    def __init__(self, replies: list[str]):
        self.replies, self.seen = list(replies), []

    def chat(self, conversations, params=None, tools=None):
        self.seen.append(conversations[0])
        text = self.replies.pop(0)
        return [Completion(text, [], None, [], "stop") for _ in conversations]


class FakeTracker:
    """Records what `attack_task.sample_logger` sends to MLflow (the artifact's file is read back at once)."""

    def __init__(self):
        self.artifacts, self.metrics, self.tags = [], [], {}

    def log_artifact(self, path, where=None):
        self.artifacts.append((str(path), where))

    def log_metrics(self, metrics, step=None):
        self.metrics.append((dict(metrics), step))

    def set_tags(self, tags):
        self.tags.update(tags)


def test_extract_code():
    assert extract_code(VALID).startswith("def reward(state):")
    assert extract_code("blah def reward(state):\n    return 1.0").startswith("def reward")


def test_refusal_is_fed_back_and_the_valid_round_kept(tmp_path):
    llm = ScriptedLLM([HOSTILE, VALID])
    out = design_reward(llm, SPEC, TINY, rounds=2, samples=1, eval_episodes=1, seed=0)
    assert not out["fallback"] and out["round"] == 1
    assert "def reward(state)" in out["code"] and "victim_collision" in out["code"]
    first, second = out["history"]
    assert first["status"] == "failed" and "Import is not allowed" in first["reason"]
    assert second["status"] == "ok" and 0.0 <= second["asr"] <= 1.0
    feedback = llm.seen[1][-1]["content"]
    assert "could not be used" in feedback and "Import is not allowed" in feedback
    assert 'state["rel"]' in llm.seen[0][1]["content"]  # the documented state API is in the task prompt


def test_every_samples_outcome_is_logged_with_its_reason(capsys):
    """One sample of each outcome before training, and one trained: the history, the printed lines and the
    per-round counts say which it was and why (the static check's refusal in its own words)."""
    crashing = "```python\ndef reward(state):\n    return state['no_such_key']\n```"
    replies = ["no code at all", HOSTILE, crashing, VALID]
    logged: list[dict] = []
    tracker = FakeTracker()
    out = design_reward(
        ScriptedLLM(replies),
        SPEC,
        TINY,
        rounds=1,
        samples=4,
        eval_episodes=1,
        log=lambda m, step: logged.append(m),
        on_sample=sample_logger(SPEC, tracker),
    )
    outcomes = [h["outcome"] for h in out["history"]]
    assert outcomes == ["unparsed", "refused", "sandbox_failed", "trained"]
    # the samples file, re-logged after every sample, and the per-sample metrics and tags
    assert [Path(p).name for p, where in tracker.artifacts] == ["highway_rear_end_samples.jsonl"] * 4
    lines = [json.loads(line) for line in Path(tracker.artifacts[-1][0]).read_text().splitlines()]
    assert [line["outcome"] for line in lines] == outcomes and "code" not in lines[0]
    assert "Import is not allowed" in lines[1]["reason"] and lines[3]["fitness"] == out["history"][3]["fitness"]
    assert [line["seed"] for line in lines] == [0, 1, 2, 3] and lines[0]["code_lines"] == 1
    assert lines[3]["cpu_s"] > lines[0]["cpu_s"] >= 0 and lines[0]["llm_cpu_s"] >= 0  # training costs most
    steps = [step for _, step in tracker.metrics]
    assert steps == [0, 1, 2, 3]
    key = "aed/highway/rear_end/eureka/sample_outcome"
    assert [m[key] for m, _ in tracker.metrics] == [float(OUTCOMES.index(o)) for o in outcomes]
    assert [m["aed/highway/rear_end/eureka/sample_fitness"] for m, _ in tracker.metrics][:3] == [-1.0] * 3
    assert "refused (rejected: Import is not allowed" in tracker.tags["aed.eureka.highway.rear_end.r1s2"]
    assert "Import is not allowed" in out["history"][1]["reason"] and "KeyError" in out["history"][2]["reason"]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[aed] eureka")]
    assert len(lines) == 4 and "round 1 sample 2: refused (rejected: Import is not allowed" in lines[1]
    assert "sample 4: trained, fitness" in lines[3]
    assert logged[0]["eureka/refused"] == 1 and logged[0]["eureka/trained"] == 1 and logged[0]["eureka/unparsed"] == 1


def test_every_round_failing_falls_back(tiny_llm):
    # the random-weight tiny model writes no valid reward: the loop must say so and never raise
    out = design_reward(tiny_llm, SPEC, TINY, rounds=2, samples=1, eval_episodes=1, seed=0, max_tokens=24)
    assert out["fallback"] and out["code"] is None
    assert out["reason"].startswith("all 2 LLM reward candidates failed")
    assert len(out["history"]) == 2


def test_deeply_nested_candidate_fails_alone_and_the_valid_round_is_kept():
    nested = "```python\ndef reward(state):\n    return " + "-" * 19_900 + "1.0\n```"
    llm = ScriptedLLM([VALID, nested])
    out = design_reward(llm, SPEC, TINY, rounds=2, samples=1, eval_episodes=1, seed=0)
    assert not out["fallback"] and out["round"] == 0 and "victim_collision" in out["code"]
    assert out["history"][1]["status"] == "failed" and "nested too deeply" in out["history"][1]["reason"]


def test_an_llm_reward_dropped_mid_training_is_reported():
    from dataclasses import replace

    from palaestra.aed.adversary import build_model, train_adversary
    from palaestra.aed.attack_task import reward_provenance

    slow = "def reward(state):\n    n = 0\n    while state['t'] >= 0:\n        n = n + 1\n    return 0.0\n"
    model = build_model(replace(SPEC, reward_code=slow), TINY, seed=0)
    stats = train_adversary(model, 6)
    model.get_env().close()
    assert stats["reward_dropped_at"] == 1 and "timed out" in stats["reward_errors"][0]
    assert reward_provenance("llm", stats) == {"reward_source": "llm_dropped", "reward_dropped_at": 1}
    assert reward_provenance("llm", {**stats, "reward_dropped_at": None}) == {"reward_source": "llm"}


def test_learning_curve_carries_rates_and_reward_components():
    from dataclasses import replace

    from palaestra.aed.adversary import build_model, train_adversary

    code = "def reward(state):\n    return {'near': -0.01 * state['rel']['dist'], 'one': 1.0}\n"
    model = build_model(replace(SPEC, reward_code=code), TINY, seed=0)
    stats = train_adversary(model, 24, log_every=8, target="rear_end")
    model.get_env().close()
    curve = stats["curve"]
    assert len(curve) >= 2 and sum(p["episodes"] for p in curve) == stats["episodes"]
    for point in curve:
        assert 0.0 <= point["target_rate"] <= point["attack_rate"] <= 1.0
        # 'one' pays 1 per step: its per-episode total is the mean episode length (episodes end by max_steps=4)
        assert point["components"]["one"] == pytest.approx(point["episode_length"])
        assert point["components"]["near"] < 0
        assert point["episode_reward"] == pytest.approx(point["components"]["one"] + point["components"]["near"])


def test_reflection_lists_each_component_with_max_mean_min():
    from palaestra.aed.eureka import reflection

    point = {"target_rate": 0.0, "attack_rate": 0.5, "episode_reward": 2.0, "episode_length": 4.0}
    curve = [{**point, "components": {"near": 1.0}}, {**point, "components": {"near": 3.0}, "target_rate": 0.5}]
    text = reflection(curve)
    assert "component near: [1.00, 3.00], Max: 3.00, Mean: 2.00, Min: 1.00" in text
    assert "target_rate: [0.00, 0.50], Max: 0.50, Mean: 0.25, Min: 0.00" in text


def test_component_statistics_and_intervals_reach_the_llm():
    components = (
        "```python\ndef reward(state):\n    return {'near': -0.01 * state['rel']['dist'], "
        "'crash': 10.0 * state['event']['victim_collision']}\n```"
    )
    llm = ScriptedLLM([components, VALID])
    design_reward(llm, SPEC, TINY, rounds=2, samples=1, eval_episodes=2, seed=0, log_every=8)
    feedback = llm.seen[1][-1]["content"]
    assert "component near: [" in feedback and "component crash: [" in feedback and "Max: " in feedback
    assert "every 8 training steps" in feedback and "95% CI" in feedback


class SeedRecorder(LLMClient):
    """Answers VALID and records the seed and number of conversations of every chat call."""

    def __init__(self):
        self.calls: list[tuple[int, int | None]] = []

    def chat(self, conversations, params=None, tools=None):
        self.calls.append((len(conversations), params.seed))
        return [Completion(VALID, [], None, [], "stop") for _ in conversations]


def test_every_sample_of_every_round_has_its_own_seed():
    llm = SeedRecorder()
    design_reward(llm, SPEC, TrainSettings(timesteps=8, learning_starts=4), rounds=2, samples=3, eval_episodes=1)
    assert [n for n, _ in llm.calls] == [1] * 6  # one conversation per call
    seeds = [s for _, s in llm.calls]
    assert len(set(seeds)) == 6 and None not in seeds


@pytest.mark.server
def test_distinct_samples_over_the_openai_backend(tiny_server):
    """Against `palaestra serve`: one call with one seed for 4 copies of the conversation gives 4 equal texts
    (what the loop did); `draw_samples` gives 4 distinct ones, the same again on a second draw."""
    from palaestra.aed.eureka import draw_samples
    from palaestra.shared.llm import LLMConfig, SamplingParams, make_client

    client = make_client(LLMConfig(backend="openai", model="tiny", base_url=tiny_server, max_retries=0))
    conversation = [{"role": "user", "content": "Write reward(state) for a rear-end accident."}]
    params = SamplingParams(temperature=0.8, max_tokens=24, logprobs=False)
    copies = client.chat([conversation] * 4, SamplingParams(temperature=0.8, max_tokens=24, seed=3, logprobs=False))
    assert len({c.text for c in copies}) == 1
    first = [c.text for c in draw_samples(client, conversation, params, 4, seed=3, round_index=0)]
    assert len(set(first)) == 4
    assert [c.text for c in draw_samples(client, conversation, params, 4, seed=3, round_index=0)] == first
    client.close()
