"""LLM-proposed accident types: parsing, checks in the sandbox, the fixed taxonomy as fallback, classification."""

from __future__ import annotations

import json

import pytest

from palaestra.aed.attribution import CollisionRecord, classify
from palaestra.aed.proposals import Taxonomy, check_type, expert_taxonomy, parse_types, propose_types
from palaestra.shared.llm.base import Completion, LLMClient

GOOD = {
    "name": "late_cut_in",
    "description": "cuts in",
    "recognizer": "def recognize(record):\n    return record['long'] > 0 and record['b_in_a_lane_s'] < 1.0\n",
}


class Answers(LLMClient):
    """Answers chat calls with the given texts in turn (the last one again once they run out); keeps the calls."""

    def __init__(self, *texts: str):
        self.texts, self.seen = list(texts), []

    def chat(self, conversations, params=None, tools=None):
        self.seen.append(conversations[0])
        text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
        return [Completion(text, [], None, [], "stop") for _ in conversations]


def rec(**kw) -> CollisionRecord:
    base = dict(
        t=3.0, step=3, a_role="victim", b_role="adv0", striker="victim", long=5.0, lat=0.0, heading_diff=0.0,
        a_speed=25.0, b_speed=20.0, a_lane="0-1-1", b_lane="0-1-1", a_lane_changing=False, b_lane_changing=False,
        b_in_a_lane_s=3.0, a_in_b_lane_s=3.0, b_min_accel=-1.0, a_min_accel=0.0,
    )  # fmt: skip
    return CollisionRecord(**{**base, **kw})


def test_parse_types_from_a_code_block_or_bare_json():
    assert parse_types("Here:\n```json\n" + json.dumps([GOOD]) + "\n```") == [GOOD]
    assert parse_types("types: " + json.dumps([GOOD, 3])) == [GOOD]
    assert parse_types("no list here") == [] and parse_types("[not json") == []


@pytest.mark.parametrize(
    "item, reason",
    [
        ({**GOOD, "name": "Bad Name"}, "bad name"),
        ({**GOOD, "name": "other"}, "reserved"),
        ({**GOOD, "description": ""}, "no description"),
        ({**GOOD, "recognizer": "import os\ndef recognize(record):\n    return True\n"}, "Import is not allowed"),
        ({**GOOD, "recognizer": "def recognize(record):\n    return 1.0\n"}, "expected bool"),
        ({**GOOD, "recognizer": "def reward(state):\n    return True\n"}, "recognize(record)"),
        ({**GOOD, "recognizer": "def recognize(record):\n    return record['nope']\n"}, "KeyError"),
        ({**GOOD, "recognizer": "def recognize(record):\n    return True\n"}, "matches every one of"),
        ({**GOOD, "recognizer": "def recognize(record):\n    return record['long'] > 99\n"}, "matches none of"),
    ],
)
def test_unusable_proposals_are_refused_with_a_reason(item, reason):
    kept, why = check_type(item, set())
    assert kept is None and reason in why


def test_usable_proposals_are_kept_and_refused_ones_reported():
    bad = {**GOOD, "name": "x_y", "recognizer": "def recognize(record):\n    return 'yes'\n"}
    out = propose_types(Answers(json.dumps([GOOD, GOOD, bad])), "highway", n_types=3, retries=0)
    assert out["source"] == "llm" and [t.name for t in out["types"]] == ["late_cut_in"]
    assert len(out["rejected"]) == 2 and "repeated" in out["rejected"][0] and "expected bool" in out["rejected"][1]


def test_refusals_are_fed_back_and_corrected_types_kept():
    fmt = {**GOOD, "name": "ramp_squeeze", "recognizer": "def recognize(record):\n    return '{0}'.format(1) == 1\n"}
    fixed = {**fmt, "recognizer": "def recognize(record):\n    return record['b_lane'].startswith('j-k')\n"}
    llm = Answers(json.dumps([GOOD, fmt]), json.dumps([fixed]))
    out = propose_types(llm, "merge", n_types=2, retries=1)
    assert [t.name for t in out["types"]] == ["late_cut_in", "ramp_squeeze"] and out["source"] == "llm"
    first, retry = llm.seen[0][0]["content"], llm.seen[1][-1]["content"]
    assert "startswith" in first and "str.format" in first  # the prompt says what the code may use
    assert "1 of your proposals could not be used" in retry and "attribute '.format' is not allowed" in retry
    assert "Kept so far: late_cut_in" in retry and len(out["responses"]) == 2


def test_scripted_merge_proposals_are_all_kept():
    # the scripted stand-in's ramp recognizer uses str.startswith, which the sandbox used to refuse
    from palaestra.aed.scripted import ScriptedDesigner

    out = propose_types(ScriptedDesigner(), "merge")
    assert out["rejected"] == [] and "ramp_merge_squeeze" in [t.name for t in out["types"]]


def test_unusable_answer_falls_back_to_the_fixed_taxonomy():
    out = propose_types(Answers("I cannot help with that."), "merge")
    assert out["source"] == "expert_fallback" and "no JSON list" in out["reason"]
    assert [t.name for t in out["types"]] == ["merge_conflict", "rear_end", "side_swipe"]
    assert all(t.recognizer is None for t in out["types"])


def test_scripted_types_classify_contacts_as_their_recognizers_say():
    from palaestra.aed.scripted import ScriptedDesigner

    out = propose_types(ScriptedDesigner(), "highway")
    assert out["source"] == "llm" and len(out["types"]) == 4
    taxonomy = Taxonomy("highway", [t.to_dict() for t in out["types"]])
    try:
        assert taxonomy(rec()) == "brake_check_rear_end"  # settled 3 s ahead in the lane
        assert taxonomy(rec(b_in_a_lane_s=0.4)) == "late_cut_in"
        assert taxonomy(rec(long=-5.0)) == "tailgater_rams_av"
        assert taxonomy(rec(lat=2.5, long=1.0)) == "lane_change_sideswipe"
        assert taxonomy(rec(heading_diff=1.6, lat=0.5)) == "other"  # no type of this list covers a crossing
    finally:
        taxonomy.close()


def test_fixed_taxonomy_types_match_classify():
    taxonomy = Taxonomy("highway", expert_taxonomy("highway"))
    for record in (rec(), rec(b_in_a_lane_s=0.4), rec(lat=2.5)):
        assert taxonomy(record) == classify(record, "highway")
    assert taxonomy(rec(heading_diff=1.6)) == "side_swipe"


def test_a_type_without_expert_reward_runs_on_its_llm_reward_alone():
    from palaestra.aed.env import AdversaryEnv
    from palaestra.aed.sandbox import SandboxedReward

    plain = AdversaryEnv("highway", "late_cut_in", overrides={"vehicles_count": 6})
    assert plain.reward_fn.__name__ == "generic_late_cut_in"  # no expert reward to build
    plain.close()
    slow = "def reward(state):\n    while state['t'] >= 0:\n        pass\n    return 0.0\n"
    env = AdversaryEnv(
        "highway", "late_cut_in", reward_fn=SandboxedReward(slow, timeout_s=0.3), overrides={"vehicles_count": 6}
    )
    env.reset(seed=0)
    _, reward, *_, info = env.step(1)
    assert "timed out" in info["reward_error"] and env.reward_fn.__name__ == "generic_late_cut_in"
    env.close()
