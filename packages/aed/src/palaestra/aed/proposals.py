"""Accident types proposed by the LLM, per scenario, each with a recognizer the sandbox runs.

The paper's first step: given the scenario and the documented collision
record (`RECORD_API`), the LLM proposes a diverse set of accident types, each
a name, a one-sentence description and ``recognize(record) -> bool`` code
that tells whether a recorded collision is of that type. The code is checked
and run like reward code (`sandbox.SandboxedRecognizer`). Proposals that do
not parse, repeat a name or whose recognizer is refused or fails on probe
records are dropped (and said so); if none is left, the fixed taxonomy
(`rewards.SCENARIO_TYPES`, recognized by `attribution.classify`) is the
fallback, as it is the expert baseline.

`Taxonomy` classifies a victim's collision: the first type (in proposal
order) whose recognizer says yes, else ``other``. A fixed-taxonomy type
(no recognizer) matches when `attribution.classify` gives its name.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from palaestra.aed.attribution import CollisionRecord, classify
from palaestra.aed.rewards import SCENARIO_TYPES, TAXONOMY
from palaestra.aed.sandbox import RewardCodeError, SandboxedRecognizer

SCENARIO_TEXT = {
    "highway": "a multi-lane motorway with dense traffic, all vehicles driving in the same direction",
    "merge": "a motorway with an on-ramp: vehicles from the ramp must merge into the right-hand lane",
    "roundabout": "a two-lane roundabout with four entries; entering vehicles must yield to the ring",
    "intersection": "a four-way crossing; the horizontal road has the right of way over the vertical one",
}

RECORD_API = """recognize(record) -> bool is called once per collision of the victim (the automated vehicle under \
test, vehicle "a") with another road user ("b"). `record` is a dict (metres, seconds, m/s, radians):
  "long", "lat": b's offset in a's frame at first contact (long + = b ahead of a; lat + = b to a's right),
  "heading_diff": b's heading minus a's, in [-pi, pi],
  "a_speed", "b_speed"; "a_lane", "b_lane": str lane ids ("<from>-<to>-<lane number>"),
  "a_lane_changing", "b_lane_changing": bool, changing lanes at contact or within the last second,
  "b_in_a_lane_s": how long b had been in a's lane before contact (up to 4), "a_in_b_lane_s": the converse,
  "b_min_accel", "a_min_accel": hardest acceleration over the last second (negative = braking, m/s^2),
  "a_headway_s": a's time headway to b one second before contact (99 if b was not ahead),
  "striker": "victim" or b's role, whichever drove into the other along the contact normal,
  "contact_axis": "longitudinal" (a's front or back met b) or "lateral" (a side contact), in a's frame,
  "b_role": "adv0", "adv1", ... (an adversary), "npc" (other traffic) or "object",
  "right_of_way": "a", "b" or "" (who had priority at a crossing).
Only `math` is available (no imports). Return True if the collision is of your type, else False."""

PROPOSE = """You help test an automated vehicle (AV) in a driving simulator. Scenario: {scenario} ({text}).
Adversarial vehicles controlled by reinforcement learning try to provoke accidents of the AV. Propose {n} \
diverse accident types for this scenario: different pre-crash manoeuvres and contact geometries, each one that \
an adversary could provoke and that reveals a flaw of the AV.

For each type write a recognizer over the recorded collision:
{api}

Answer with a JSON list only, one object per type:
[{{"name": "snake_case_name", "description": "one sentence", "recognizer": "def recognize(record):\\n    ..."}}]"""

NAME = re.compile(r"^[a-z][a-z0-9_]{1,40}$")


@dataclass
class AccidentType:
    name: str
    description: str
    recognizer: str | None = None
    """``recognize(record)`` code (LLM-proposed); None: the fixed taxonomy's `attribution.classify`."""
    source: str = "expert"
    """expert (the fixed taxonomy) | llm."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expert_taxonomy(scenario: str) -> list[AccidentType]:
    """The fixed taxonomy's default types of `scenario` (the expert baseline and the fallback)."""
    return [AccidentType(t, TAXONOMY[t]) for t in SCENARIO_TYPES[scenario]]


PROBES = [  # typical contacts (rear-end, side contact, crossing, rammed from behind) to try recognizers on
    dict(long=5.0, lat=0.2, heading_diff=0.0, a_speed=25.0, b_speed=15.0, b_in_a_lane_s=4.0, striker="victim"),
    dict(long=1.0, lat=2.2, heading_diff=0.1, a_speed=22.0, b_speed=23.0, b_lane_changing=True, striker="adv0"),
    dict(long=2.0, lat=-1.5, heading_diff=1.6, a_speed=8.0, b_speed=9.0, right_of_way="b", striker="adv0"),
    dict(long=-5.0, lat=0.0, heading_diff=0.0, a_speed=20.0, b_speed=28.0, striker="adv0", b_role="npc"),
]


def record_view(rec: CollisionRecord | dict) -> dict[str, Any]:
    """The fields of a collision record a recognizer sees (`RECORD_API`)."""
    data = rec.to_dict() if isinstance(rec, CollisionRecord) else dict(rec)
    for key in ("accident_type", "victim_responsible", "extra", "t", "step", "a_role", "features"):
        data.pop(key, None)
    return data


def probe_records() -> list[dict[str, Any]]:
    base = dict(
        t=1.0, step=1, a_role="victim", b_role="adv0", striker="victim", long=0.0, lat=0.0, heading_diff=0.0,
        a_speed=20.0, b_speed=20.0, a_lane="0-1-1", b_lane="0-1-1", a_lane_changing=False, b_lane_changing=False,
        b_in_a_lane_s=4.0, a_in_b_lane_s=4.0, b_min_accel=0.0, a_min_accel=0.0,
    )  # fmt: skip
    return [record_view(CollisionRecord(**{**base, **probe})) for probe in PROBES]


def parse_types(text: str) -> list[dict[str, Any]]:
    """The JSON list of proposed types in an answer (in a code block or bare); [] if there is none."""
    for candidate in re.findall(r"```(?:json)?\s*\n(.*?)```", text or "", flags=re.S) + [text or ""]:
        start, end = candidate.find("["), candidate.rfind("]")
        if start < 0 or end <= start:
            continue
        try:
            data = json.loads(candidate[start : end + 1])
        except json.JSONDecodeError:
            continue
        if isinstance(data, list):
            return [d for d in data if isinstance(d, dict)]
    return []


def check_type(item: dict[str, Any], taken: set[str]) -> tuple[AccidentType | None, str]:
    """A proposed type if usable, else None and why."""
    name, description, code = item.get("name"), item.get("description"), item.get("recognizer")
    if not isinstance(name, str) or not NAME.match(name):
        return None, f"bad name {name!r} (snake_case, 2-41 characters)"
    if name in taken or name in ("other", "obstacle"):
        return None, f"{name}: name repeated or reserved"
    if not isinstance(description, str) or not description.strip():
        return None, f"{name}: no description"
    if not isinstance(code, str):
        return None, f"{name}: no recognizer code"
    try:
        fn = SandboxedRecognizer(code)
        try:
            for probe in probe_records():
                fn(probe)
        finally:
            fn.close()
    except RewardCodeError as err:
        return None, f"{name}: {err.reason}"
    return AccidentType(name, description.strip(), code, "llm"), ""


def propose_types(
    client, scenario: str, n_types: int = 4, temperature: float = 0.7, max_tokens: int = 1536, seed: int = 0
) -> dict[str, Any]:
    """Ask `client` for `n_types` accident types of `scenario`; ``{"types", "source", "rejected", "reason",
    "response"}`` with ``source`` llm, or expert_fallback when no proposal is usable."""
    from palaestra.shared.llm import SamplingParams

    prompt = PROPOSE.format(scenario=scenario, text=SCENARIO_TEXT[scenario], n=n_types, api=RECORD_API)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, logprobs=False)
    try:
        response = client.chat([[{"role": "user", "content": prompt}]], params)[0].text
    except Exception as err:  # an unreachable LLM: the fixed taxonomy
        response, items = "", []
        reason = f"LLM unreachable: {err}"
    else:
        items = parse_types(response)
        reason = "" if items else "no JSON list of types in the answer"
    types, rejected = [], []
    for item in items[: 2 * n_types]:
        kept, why = check_type(item, {t.name for t in types})
        if kept is None:
            rejected.append(why)
        elif len(types) < n_types:
            types.append(kept)
    if not types:
        reason = reason or f"every proposal was refused ({'; '.join(rejected)[:300]})"
        return {
            "types": expert_taxonomy(scenario),
            "source": "expert_fallback",
            "rejected": rejected,
            "reason": reason,
            "response": response,
        }
    return {"types": types, "source": "llm", "rejected": rejected, "reason": "", "response": response}


class Taxonomy:
    """Classifies a victim's collision into the first matching type (proposal order), else ``other``."""

    def __init__(self, scenario: str, types: list[AccidentType | dict[str, Any]]):
        self.scenario = scenario
        self.types = [t if isinstance(t, AccidentType) else AccidentType(**t) for t in types]
        self._recognizers: dict[str, SandboxedRecognizer] = {}
        self.errors: dict[str, str] = {}

    def __call__(self, rec: CollisionRecord) -> str:
        fixed = classify(rec, self.scenario)
        view = None
        for t in self.types:
            if t.recognizer is None:
                if fixed == t.name:
                    return t.name
                continue
            if t.name in self.errors:
                continue
            view = view or record_view(rec)
            try:
                if t.name not in self._recognizers:
                    self._recognizers[t.name] = SandboxedRecognizer(t.recognizer, check=True)
                if self._recognizers[t.name](view):
                    return t.name
            except RewardCodeError as err:  # a failing recognizer stops matching; the others go on
                self.errors[t.name] = err.reason
        return "other"

    def close(self) -> None:
        for fn in self._recognizers.values():
            fn.close()
