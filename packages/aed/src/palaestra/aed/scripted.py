"""A scripted stand-in for the LLM on CPU: fixed accident-type proposals and fixed reward programs.

``llm.backend: aed_scripted`` answers the two prompts of AED without a model:

- the accident-type proposal (`proposals.PROPOSE`): a fixed list per scenario,
  names not in the fixed taxonomy (so they run with LLM rewards alone), each
  with recognizer code as an LLM would write it;
- the reward-design task (`eureka.TASK`): a fixed reward program for the
  asked type, chosen by keywords of its name (longitudinal, lateral, cut-in,
  or crossing/merging conflict), written with named components; later rounds
  of the same conversation rescale the shaping (0.5x, then 2x), so that
  Eureka's loop has different candidates to compare.

It is no language model: runs with it measure the pipeline and these fixed
programs, not an LLM's design. Results say which backend produced them.
"""

from __future__ import annotations

import json
import re

from palaestra.shared.llm.base import Completion, LLMClient, LLMConfig

LONGITUDINAL = """def reward(state):
    rel = state["rel"]
    event = state["event"]
    lane = 1.0 if rel["same_lane"] > 0.5 else 0.0
    follow = lane * math.exp(-((abs(rel["long"]) - 6.0) ** 2) / 50.0)
    close = lane * max(0.0, min(rel["closing_speed"], 10.0)) / 20.0
    hit = 0.0
    if event["victim_collision"] > 0.5:
        hit = 12.0 if event["accident_type"] == "{name}" else 0.0
    crash = -4.0 * event["adv_crashed_other"] - 2.0 * (1.0 - state["adv"]["on_road"])
    return {{"follow": {w} * 0.3 * follow, "close": {w} * close, "hit": hit, "crash": crash}}
"""

LATERAL = """def reward(state):
    rel = state["rel"]
    event = state["event"]
    beside = (1.0 - rel["same_lane"]) * math.exp(-(rel["long"] ** 2) / 18.0)
    beside = beside * math.exp(-((abs(rel["lat"]) - 4.0) ** 2) / 8.0)
    swerve = beside * state["adv"]["lane_changing"]
    hit = 0.0
    if event["victim_collision"] > 0.5:
        hit = 12.0 if event["accident_type"] == "{name}" else 0.0
    crash = -4.0 * event["adv_crashed_other"] - 2.0 * (1.0 - state["adv"]["on_road"])
    return {{"beside": {w} * 0.2 * beside, "swerve": {w} * 0.3 * swerve, "hit": hit, "crash": crash}}
"""

CUT_IN = """def reward(state):
    rel = state["rel"]
    event = state["event"]
    ahead = (1.0 - rel["same_lane"]) * math.exp(-((rel["long"] - 8.0) ** 2) / 40.0)
    merge = ahead * state["adv"]["lane_changing"]
    hit = 0.0
    if event["victim_collision"] > 0.5:
        hit = 12.0 if event["accident_type"] == "{name}" else 0.0
    crash = -4.0 * event["adv_crashed_other"] - 2.0 * (1.0 - state["adv"]["on_road"])
    return {{"ahead": {w} * 0.2 * ahead, "merge": {w} * 0.3 * merge, "hit": hit, "crash": crash}}
"""

CONFLICT = """def reward(state):
    rel = state["rel"]
    event = state["event"]
    approach = math.exp(-rel["dist"] / 25.0)
    close = max(0.0, min(rel["closing_speed"], 10.0)) / 20.0
    hit = 0.0
    if event["victim_collision"] > 0.5:
        hit = 12.0 if event["accident_type"] == "{name}" else 0.0
    crash = -4.0 * event["adv_crashed_other"] - 2.0 * (1.0 - state["adv"]["on_road"])
    return {{"approach": {w} * 0.2 * approach, "close": {w} * close, "hit": hit, "crash": crash}}
"""

LONG = "abs(record['lat']) < 1.5 and abs(record['heading_diff']) < 0.5"
PROPOSALS = {
    "highway": [
        ("brake_check_rear_end", "the AV drives into the back of a vehicle settled in its lane that brakes",
         f"{LONG} and record['long'] > 0 and record['b_in_a_lane_s'] >= 1.0"),
        ("late_cut_in", "a vehicle changes into the AV's lane just ahead of it and the AV hits its back",
         f"{LONG} and record['long'] > 0 and record['b_in_a_lane_s'] < 1.0"),
        ("lane_change_sideswipe", "side contact while one of the two vehicles changes lanes next to the other",
         "abs(record['lat']) >= 1.5 and abs(record['heading_diff']) < 0.5"),
        ("tailgater_rams_av", "a vehicle behind the AV in its lane closes in and hits its back",
         f"{LONG} and record['long'] < 0"),
    ],
    "merge": [
        ("ramp_merge_squeeze", "contact at the on-ramp merge while a vehicle joins the main road",
         "record['a_lane'].startswith('j-k') or record['b_lane'].startswith('j-k') or "
         "record['a_lane'].startswith('k-b') or record['b_lane'].startswith('k-b') or "
         "'b-c-2' in (record['a_lane'], record['b_lane'])"),
        ("main_road_sideswipe", "side contact between lanes of the main road",
         "abs(record['lat']) >= 1.5"),
        ("main_road_rear_end", "longitudinal contact within one lane of the main road", LONG),
    ],
    "roundabout": [
        ("failure_to_yield_at_entry", "contact between a vehicle entering and one on the ring",
         "record['right_of_way'] != ''"),
        ("ring_rear_end", "longitudinal contact between two vehicles following each other", LONG),
    ],
    "intersection": [
        ("crossing_t_bone", "the front of one vehicle hits the side of a crossing vehicle",
         "abs(record['heading_diff']) > 0.5"),
        ("queue_rear_end", "longitudinal contact between vehicles in the same approach lane", LONG),
    ],
}  # fmt: skip


def proposal_answer(scenario: str) -> str:
    types = [
        {"name": n, "description": d, "recognizer": f"def recognize(record):\n    return bool({cond})\n"}
        for n, d, cond in PROPOSALS.get(scenario, [])
    ]
    return "```json\n" + json.dumps(types, indent=1) + "\n```"


def reward_answer(name: str, round_index: int) -> str:
    if any(k in name for k in ("cut_in", "cut-in")):
        template = CUT_IN
    elif any(k in name for k in ("swipe", "side", "flank")):
        template = LATERAL
    elif any(k in name for k in ("rear", "tailgat", "brake")):
        template = LONGITUDINAL
    else:
        template = CONFLICT
    weight = (1.0, 0.5, 2.0)[round_index % 3]
    return "```python\n" + template.format(name=name, w=weight) + "```"


class ScriptedDesigner(LLMClient):
    """The ``aed_scripted`` backend (module docstring); any other prompt gets an empty answer."""

    def __init__(self, config: LLMConfig | None = None):
        self.config = config or LLMConfig(backend="aed_scripted", model="scripted")
        self.tokenizer = None

    def chat(self, conversations, params=None, tools=None) -> list[Completion]:
        outs = []
        for conv in conversations:
            first = next((m["content"] for m in conv if m["role"] == "user"), "")
            rounds = sum(m["role"] == "assistant" for m in conv)
            proposal = re.search(r"Scenario: (\w+) \(", first) if "Propose" in first else None
            target = re.search(r"Accident type to provoke: (\w+)", first)
            if proposal:
                text = proposal_answer(proposal.group(1))
            elif target:
                text = reward_answer(target.group(1), rounds)
            else:
                text = ""
            outs.append(Completion(text, [], None, [], "stop"))
        n = params.n if params is not None else 1
        return [o for o in outs for _ in range(n)]
