"""Accident types proposed by the LLM, per scenario, each with a recognizer the sandbox runs.

The paper's first step: given the scenario and the documented collision
record (`RECORD_API`), the LLM proposes a diverse set of accident types, each
a name, a one-sentence description and ``recognize(record) -> bool`` code
that tells whether a recorded collision is of that type. The prompt says
which operations the code may use (`allowlist.ALLOWED_TEXT`). The code is
checked and run like reward code (`sandbox.SandboxedRecognizer`) on the
scenario's probe records (`probe_records`: typical contacts of that road).
A proposal that does not parse, repeats a name, whose recognizer is refused
or fails, or does not discriminate (it matches every probe record, or none)
is refused with its reason; the refusals go back to the model, which gets
``retries`` more answers to correct them. If no type is left, the fixed
taxonomy (`rewards.SCENARIO_TYPES`, recognized by `attribution.classify`) is
the fallback, as it is the expert baseline.

`Taxonomy` classifies a victim's collision: the first type (in proposal
order) whose recognizer says yes, else ``other``. A fixed-taxonomy type
(no recognizer) matches when `attribution.classify` gives its name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from palaestra.aed.allowlist import ALLOWED_TEXT, RewardCodeError
from palaestra.aed.attribution import CollisionRecord, classify
from palaestra.aed.rewards import SCENARIO_TYPES, TAXONOMY
from palaestra.aed.sandbox import SandboxedRecognizer

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
Return True if the collision is of your type, else False: the recognizer must tell its type from other \
collisions (one that says True, or False, for every collision is refused)."""

PROPOSE = """You help test an automated vehicle (AV) in a driving simulator. Scenario: {scenario} ({text}).
Adversarial vehicles controlled by reinforcement learning try to provoke accidents of the AV. Propose {n} \
diverse accident types for this scenario: different pre-crash manoeuvres and contact geometries, each one that \
an adversary could provoke and that reveals a flaw of the AV.

For each type write a recognizer over the recorded collision:
{api}
{allowed}
Answer with a JSON list only, one object per type:
[{{"name": "snake_case_name", "description": "one sentence", "recognizer": "def recognize(record):\\n    ..."}}]"""

RETRY = """{count} of your proposals could not be used:
{reasons}
Kept so far: {kept}. Answer with a JSON list of {missing} more types in the same format: corrected versions of \
the refused ones, or other types (names not yet used). {allowed}"""

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


MAIN_LANES = {
    "highway": ("0-1-1", "0-1-2"),
    "merge": ("b-c-1", "b-c-0"),
    "roundabout": ("se-ex-0", "se-ex-1"),
    "intersection": ("o0-ir0-0", "o0-ir0-0"),
}
"""Per scenario, the victim's lane and a neighbouring one in the probe records (highway-env lane ids)."""
PROBES = [  # typical contacts on any road: (fields, b in the victim's lane)
    (dict(long=5.0, lat=0.2, a_speed=25.0, b_speed=15.0, striker="victim", contact_axis="longitudinal"), True),
    (dict(long=5.5, lat=0.6, a_speed=25.0, b_speed=22.0, b_in_a_lane_s=0.4, b_lane_changing=True, striker="victim",
          contact_axis="longitudinal"), True),
    (dict(long=1.0, lat=2.2, heading_diff=0.1, a_speed=22.0, b_speed=23.0, b_lane_changing=True, b_in_a_lane_s=0.0,
          a_in_b_lane_s=0.0, striker="adv0", contact_axis="lateral"), False),
    (dict(long=-5.0, a_speed=20.0, b_speed=28.0, b_min_accel=0.0, a_min_accel=-6.0, striker="adv0",
          contact_axis="longitudinal"), True),
    (dict(long=5.0, a_speed=20.0, b_speed=8.0, b_min_accel=-7.0, a_headway_s=0.8, striker="victim",
          contact_axis="longitudinal", b_role="npc"), True),
]  # fmt: skip
SCENARIO_PROBES = {  # contacts only one road has: a ramp, a roundabout entry, a crossing
    "merge": [dict(long=1.5, lat=3.0, heading_diff=0.25, a_speed=22.0, b_speed=18.0, b_lane="j-k-0",
                   b_lane_changing=True, striker="adv0", contact_axis="lateral")],
    "roundabout": [dict(long=2.0, lat=-2.0, heading_diff=1.2, a_speed=8.0, b_speed=7.0, b_lane="ses-se-0",
                        right_of_way="a", striker="adv0", contact_axis="lateral")],
    "intersection": [dict(long=2.0, lat=-1.5, heading_diff=1.6, a_speed=8.0, b_speed=9.0, b_lane="o1-ir1-0",
                          right_of_way="a", striker="adv0", contact_axis="lateral")],
    "highway": [],
}  # fmt: skip


def record_view(rec: CollisionRecord | dict) -> dict[str, Any]:
    """The fields of a collision record a recognizer sees (`RECORD_API`)."""
    data = rec.to_dict() if isinstance(rec, CollisionRecord) else dict(rec)
    for key in ("accident_type", "victim_responsible", "extra", "t", "step", "a_role", "features"):
        data.pop(key, None)
    return data


def probe_records(scenario: str = "highway") -> list[dict[str, Any]]:
    """Typical contacts of `scenario` as a recognizer sees them: a usable recognizer matches some, not all."""
    own, other = MAIN_LANES[scenario]
    base = dict(
        t=1.0, step=1, a_role="victim", b_role="adv0", striker="victim", long=0.0, lat=0.0, heading_diff=0.0,
        a_speed=20.0, b_speed=20.0, a_lane=own, b_lane=own, a_lane_changing=False, b_lane_changing=False,
        b_in_a_lane_s=4.0, a_in_b_lane_s=4.0, b_min_accel=0.0, a_min_accel=0.0,
    )  # fmt: skip
    probes = [{**probe, "b_lane": own if same else other} for probe, same in PROBES]
    probes += [{"b_in_a_lane_s": 0.0, "a_in_b_lane_s": 0.0, **p} for p in SCENARIO_PROBES[scenario]]
    return [record_view(CollisionRecord(**{**base, **probe})) for probe in probes]  # type: ignore[arg-type]


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


def check_type(item: dict[str, Any], taken: set[str], scenario: str = "highway") -> tuple[AccidentType | None, str]:
    """A proposed type if usable, else None and why (its recognizer must run on `probe_records` and tell some of
    them from the others)."""
    name, description, code = item.get("name"), item.get("description"), item.get("recognizer")
    if not isinstance(name, str) or not NAME.match(name):
        return None, f"bad name {name!r} (snake_case, 2-41 characters)"
    if name in taken or name in ("other", "obstacle"):
        return None, f"{name}: name repeated or reserved"
    if not isinstance(description, str) or not description.strip():
        return None, f"{name}: no description"
    if not isinstance(code, str):
        return None, f"{name}: no recognizer code"
    probes = probe_records(scenario)
    try:
        fn = SandboxedRecognizer(code)
        try:
            verdicts = [fn(probe) for probe in probes]
        finally:
            fn.close()
    except RewardCodeError as err:
        return None, f"{name}: {err.reason}"
    if all(verdicts) or not any(verdicts):
        which = "every one" if all(verdicts) else "none"
        return None, (
            f"{name}: the recognizer matches {which} of {len(probes)} typical collisions of this scenario (rear-end, "
            "cut-in, side contact, rammed from behind, brake check, and the scenario's own); it must tell its type "
            "from the others"
        )
    return AccidentType(name, description.strip(), code, "llm"), ""


def propose_types(
    client,
    scenario: str,
    n_types: int = 4,
    temperature: float = 0.7,
    max_tokens: int = 1536,
    seed: int = 0,
    retries: int = 1,
) -> dict[str, Any]:
    """Ask `client` for `n_types` accident types of `scenario`, feeding refusals back up to `retries` times;
    ``{"types", "source", "rejected", "reason", "response", "responses"}`` with ``source`` llm, or
    expert_fallback when no proposal is usable."""
    from palaestra.shared.llm import SamplingParams

    prompt = PROPOSE.format(
        scenario=scenario, text=SCENARIO_TEXT[scenario], n=n_types, api=RECORD_API, allowed=ALLOWED_TEXT
    )
    conversation = [{"role": "user", "content": prompt}]
    types: list[AccidentType] = []
    rejected: list[str] = []
    responses: list[str] = []
    reason = ""
    for attempt in range(1 + retries):
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + attempt, logprobs=False)
        try:
            response = client.chat([conversation], params)[0].text
        except Exception as err:  # an unreachable LLM: what was kept, else the fixed taxonomy
            reason = f"LLM unreachable: {err}"
            break
        responses.append(response)
        items = parse_types(response)
        refused = [] if items else ["no JSON list of types in the answer"]
        for item in items[: 2 * n_types]:
            kept, why = check_type(item, {t.name for t in types}, scenario)
            if kept is None:
                refused.append(why)
            elif len(types) < n_types:
                types.append(kept)
        rejected += refused
        if len(types) >= n_types or not refused:
            break
        retry = RETRY.format(
            count=len(refused),
            reasons="\n".join(f"- {r[:300]}" for r in refused),
            kept=", ".join(t.name for t in types) or "none",
            missing=n_types - len(types),
            allowed=ALLOWED_TEXT,
        )
        conversation = conversation + [{"role": "assistant", "content": response}, {"role": "user", "content": retry}]
    last = responses[-1] if responses else ""
    if not types:
        reason = reason or f"every proposal was refused ({'; '.join(rejected)[:300]})"
        return {
            "types": expert_taxonomy(scenario),
            "source": "expert_fallback",
            "rejected": rejected,
            "reason": reason,
            "response": last,
            "responses": responses,
        }
    return {
        "types": types,
        "source": "llm",
        "rejected": rejected,
        "reason": "",
        "response": last,
        "responses": responses,
    }


class Taxonomy:
    """Classifies a victim's collision into the first matching type (proposal order), else ``other``."""

    def __init__(self, scenario: str, types: Sequence[AccidentType | dict[str, Any]]):
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
