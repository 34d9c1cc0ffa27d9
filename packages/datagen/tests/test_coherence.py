"""Goal coherence by replay (`coherence.check_row`): every step follows from the user's goal.

Two kinds of evidence. On the deterministic pipeline's output (the shipped config's settings, 120 items),
independent re-checks written here find no hidden step that changes state, no stated step the goal does not
need, no empty range, no id flowing into a name, and a closing reply that reports each requested result.
On a small garage environment written here, one deliberately bad trace per check is flagged (a negative
control each) while the good trace passes; and a bad trace fed to the pipeline is dropped and counted.
"""

from __future__ import annotations

import ast
import copy
import json
import random

import pytest

from palaestra.datagen.argfill import tokens
from palaestra.datagen.coherence import PROBLEMS, check_row
from palaestra.datagen.envs import ApiEnvSpec, ToolEnv, get_env, register_env

LONG = "Minutes: the tundra team agreed to move the launch by one week. Remember to renew the atlas subscription."


class Garage:
    def _load_scenario(self, config):
        self.tickets = dict(config.get("tickets", {}))
        self.logged_in = False
        self.climate_mode = "auto"
        self.headlight_mode = "off"
        self.contacts: list[str] = []

    def login(self, password: str):
        if password != "pw":
            return {"error": "wrong password"}
        self.logged_in = True
        return {"login_status": True}

    def find_ticket(self, title: str):
        ids = [i for i, t in self.tickets.items() if t == title]
        return {"ticket_id": int(ids[0])} if ids else {"error": "not found"}

    def create_ticket(self, title: str):
        new = str(100 + len(self.tickets))
        self.tickets[new] = title
        return {"ticket_id": int(new)}

    def close_ticket(self, ticket_id: int):
        if not self.logged_in:
            return {"error": "log in first"}
        self.tickets.pop(str(ticket_id))
        return {"closed_ticket": ticket_id}

    def set_climate(self, climate_mode: str):
        self.climate_mode = climate_mode
        return {"climate_mode": climate_mode}

    def set_headlights(self, mode: str):
        self.headlight_mode = mode
        return {"headlight_mode": mode}

    def get_user(self, name: str):
        return {"user_id": "U" + name[:2].upper()}

    def add_contact(self, user_name: str):
        self.contacts.append(user_name)
        return {"added_contact": user_name}

    def filter_by_price(self, min_price: float, max_price: float):
        return {"matches": [p for p in (3.0, 5.0, 9.0) if min_price <= p <= max_price]}

    def read_note(self, name: str):
        return {"note_content": LONG}


def _doc(tool: str, **params: str) -> dict:
    props = {p: {"type": t, "description": f"The {p.replace('_', ' ')}."} for p, t in params.items()}
    return {
        "name": tool,
        "description": f"Does {tool.replace('_', ' ')}.",
        "parameters": {"type": "dict", "properties": props, "required": list(props)},
    }


DOCS = [
    _doc("login", password="string"),
    _doc("find_ticket", title="string"),
    _doc("create_ticket", title="string"),
    _doc("close_ticket", ticket_id="integer"),
    _doc("set_climate", climate_mode="string"),
    _doc("set_headlights", mode="string"),
    _doc("get_user", name="string"),
    _doc("add_contact", user_name="string"),
    _doc("filter_by_price", min_price="float", max_price="float"),
    _doc("read_note", name="string"),
]
STATE = {"tickets": {"7": "Printer jam", "8": "Broken chair"}}


@pytest.fixture(scope="module")
def garage():
    try:
        return get_env("GarageTest")
    except Exception:
        return register_env(ApiEnvSpec("GarageTest", Garage, DOCS, [STATE]))


def _row(spec, turns: list[tuple[str, list[tuple], str]]) -> dict:
    """A row from (query, [(tool, arguments, feeds {param: (step, key)})], reply) per turn, executed here."""
    env = ToolEnv(spec, copy.deepcopy(STATE))
    messages, traces = [], []
    for query, calls, reply in turns:
        messages.append({"role": "user", "content": query, "tool_calls": None})
        steps = []
        for n, (name, args, feeds) in enumerate(calls):
            ex = env.execute(name, args)
            assert ex.ok, (name, ex.output)
            steps.append(
                {
                    "name": name,
                    "arguments": args,
                    "output": ex.output,
                    "feeds": {p: src for p, (src, _) in feeds.items()},
                    "feed_keys": {p: key for p, (_, key) in feeds.items()},
                    "prior_feeds": {},
                    "selectors": {},
                }
            )
            call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            messages.append({"role": "assistant", "content": "<think>step</think>", "tool_calls": [call]})
            messages.append({"role": "tool", "content": json.dumps(ex.output), "tool_call_id": f"c{n}", "name": name})
        messages.append({"role": "assistant", "content": f"<think>done</think>\n{reply}", "tool_calls": None})
        traces.append({"target": calls[-1][0], "target_hit": True, "steps": steps})
    return {
        "messages": messages,
        "initial_config": json.dumps({"GarageTest": STATE}),
        "provenance": {"env": "GarageTest", "trace": json.dumps(traces)},
    }


GOOD = [
    ("login", {"password": "pw"}, {}),
    ("find_ticket", {"title": "Printer jam"}, {}),
    ("close_ticket", {"ticket_id": 7}, {"ticket_id": (1, "ticket_id")}),
]
BAD = {
    # a stated step the goal does not need: the climate has nothing to do with closing a ticket
    "unneeded_prerequisite": [("set_climate", {"climate_mode": "cool"}, {}), *GOOD],
    # a hidden step whose result feeds only a step the goal does not need
    "unneeded_step": [
        ("get_user", {"name": "ada"}, {}),
        ("add_contact", {"user_name": "UAD"}, {"user_name": (0, "user_name")}),
        *[(n, a, {p: (s + 2, k) for p, (s, k) in f.items()}) for n, a, f in GOOD],
    ],
    # "close the ticket titled X" answered by creating one and closing that
    "unrequested_state_change": [
        ("login", {"password": "pw"}, {}),
        ("create_ticket", {"title": "Printer jam"}, {}),
        ("close_ticket", {"ticket_id": 102}, {"ticket_id": (1, "ticket_id")}),
    ],
    # a climate mode into a headlight mode; a user id into a user name
    "kind_mismatch": [
        ("set_climate", {"climate_mode": "auto"}, {}),
        ("set_headlights", {"mode": "auto"}, {"mode": (0, "climate_mode")}),
    ],
    "empty_range": [("filter_by_price", {"min_price": 5.0, "max_price": 5.0}, {})],
}


def test_a_good_trace_passes_every_check(garage):
    assert (
        check_row(_row(garage, [("close my printer ticket", GOOD, "Login status: yes. Closed ticket 7.")]), garage)
        == []
    )
    ranged = [("filter_by_price", {"min_price": 4.0, "max_price": 9.5}, {})]
    assert check_row(_row(garage, [("what costs 4 to 9.5?", ranged, "Matches: 5.0, 9.0.")]), garage) == []
    note = [("read_note", {"name": "minutes"}, {})]
    quoted = f"Here it is: '{LONG[:80]}...' ({len(LONG)} characters)."
    assert check_row(_row(garage, [("read my minutes", note, quoted)]), garage) == []


@pytest.mark.parametrize("problem", sorted(BAD))
def test_each_bad_trace_is_flagged(garage, problem):
    last = BAD[problem][-1]
    reply = f"Done: {json.dumps(last[1])} -> ok 7 102 auto 'UAD' cool."
    assert problem in check_row(_row(garage, [("a request", BAD[problem], reply)]), garage)


def test_an_id_into_a_name_is_flagged(garage):
    calls = [("get_user", {"name": "ada"}, {}), ("add_contact", {"user_name": "UAD"}, {"user_name": (0, "user_id")})]
    assert "kind_mismatch" in check_row(_row(garage, [("add ada", calls, "Added 'UAD'.")]), garage)


def test_an_unreported_result_is_flagged(garage):
    note = [("read_note", {"name": "minutes"}, {})]
    for reply in ("Done. There was nothing else to report.", "Done.", "Here it is: 'Minutes: the"):
        assert check_row(_row(garage, [("read my minutes", note, reply)]), garage) == ["unreported_result"], reply


def test_a_bad_trace_in_the_pipeline_is_dropped_and_counted(garage, monkeypatch):
    from palaestra.datagen import pipeline
    from palaestra.datagen.run_stats import RunStats
    from palaestra.datagen.sampler import Trace, TraceStep

    env = ToolEnv(garage, copy.deepcopy(STATE))
    steps = []
    for name, args, feeds in BAD["unrequested_state_change"]:
        steps.append(TraceStep(name, args, env.execute(name, args).output, {p: s for p, (s, _) in feeds.items()}))
        steps[-1].feed_keys = {p: k for p, (_, k) in feeds.items()}

    def bad_trace(env, *args, **kwargs):
        return Trace("GarageTest", "close_ticket", copy.deepcopy(steps), True), env

    monkeypatch.setattr(pipeline, "turn_trace", bad_trace)
    roles, _ = pipeline.make_roles(pipeline.RolesConfig(naive_first_try=0.0))
    item = {"id": "g-0", "seed": 0, "env": "GarageTest", "scenario": 0, "target": "close_ticket", "round": 0}
    graph = type("G", (), {"version": 0})()
    cfg = pipeline.ItemConfig(max_turns=1, p_miss_param=0.0, p_miss_func=0.0)
    result = pipeline.generate_item(item, graph, roles, cfg)
    assert result["drop"] == "coherence_unrequested_state_change", result["drop"]
    stats = RunStats(envs={"GarageTest": [d["name"] for d in DOCS]})
    stats.add(result, kept=False)
    report = stats.report()
    assert report["coherence"]["dropped"] == 1 and report["coherence"]["problems"]["unrequested_state_change"] == 1


# -- the shipped pipeline's output, re-checked independently ------------------------------------------------


@pytest.fixture(scope="module")
def rows(deterministic_run):
    path, _ = deterministic_run
    return [json.loads(line) for line in path.read_text().splitlines()]


def _state(env: ToolEnv) -> str:
    return json.dumps({k: v for k, v in vars(env.instance).items() if not k.startswith("_")}, default=str)


def _turn_starts(row):
    """(fresh env at each turn's start, that turn's steps), replayed here from the initial config."""
    spec = get_env(row["provenance"]["env"])
    env = ToolEnv(spec, json.loads(row["initial_config"])[spec.bfcl_class or spec.name])
    batches = [
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m["tool_calls"]]
        for m in row["messages"]
        if len(m.get("tool_calls") or []) >= 2
    ]
    for trace in json.loads(row["provenance"]["trace"]):
        if [(s["name"], s["arguments"]) for s in trace["steps"]] not in batches:  # parallel goals: test_harder
            yield env.copy(), trace["steps"]
        for s in trace["steps"]:
            env.execute(s["name"], s["arguments"])


def test_stats_count_every_check(deterministic_run):
    path, result = deterministic_run
    stats = json.loads((path.parent / "stats.json").read_text())
    assert set(stats["coherence"]["problems"]) == set(PROBLEMS)
    assert stats["coherence"]["checked"] >= stats["kept"] > 0
    assert stats["coherence"]["dropped"] == sum(n for k, n in stats["drops"].items() if k.startswith("coherence_"))
    assert stats["incoherent_kept"] == {}


def test_kept_rows_hidden_steps_change_no_state_and_every_step_is_needed(rows):
    multi = 0
    for row in rows:
        for start, steps in _turn_starts(row):
            fed = {src for s in steps for src in s["feeds"].values()}
            env = start.copy()
            for i, s in enumerate(steps):
                before = _state(env)
                env.execute(s["name"], s["arguments"])
                if i in fed and i < len(steps) - 1:
                    assert _state(env) == before, (row["id"], s["name"])  # a hidden step only looks up
            for i in range(len(steps) - 1):
                if i in fed:
                    continue
                multi += 1
                # a stated step before the goal enables it: without it, a later call fails or returns otherwise
                full, cut = start.copy(), start.copy()
                outs = [full.execute(s["name"], s["arguments"]) for s in steps]
                rest = [cut.execute(s["name"], s["arguments"]) for j, s in enumerate(steps) if j != i]
                assert [(e.ok, e.output) for e in outs[i + 1 :]] != [(e.ok, e.output) for e in rest[i:]], row["id"]
    assert multi > 0  # some kept turns have a stated prerequisite, so the replay above ran


def test_kept_rows_ranges_are_non_empty_and_ids_flow_into_ids(rows):
    ranges = 0
    for row in rows:
        for turn in row["ground_truth"]:
            for call in turn:
                args = {k.arg: ast.literal_eval(k.value) for k in ast.parse(call, mode="eval").body.keywords}
                for p, v in args.items():
                    if p.startswith("min_") and f"max_{p[4:]}" in args:
                        ranges += 1
                        assert v < args[f"max_{p[4:]}"], call
        for _, steps in _turn_starts(row):
            for s in steps:
                for p, key in s["feed_keys"].items():
                    if "id" in tokens(key):
                        assert not tokens(p) & {"name", "amount", "mode"}, (key, s["name"], p)
                    if "climate" in tokens(key):
                        assert "climate" in tokens(s["name"] + "_" + p) or s["name"] == "adjustClimateControl"
    assert ranges > 0


def test_kept_rows_report_every_requested_result(rows):
    long_texts = 0
    for row in rows:
        replies = [
            m["content"].split("</think>")[-1]
            for m in row["messages"]
            if m["role"] == "assistant" and not m["tool_calls"] and "</think>" in m["content"]
        ]
        assert not any("nothing else to report" in r.lower() for r in replies)
        for _, steps in _turn_starts(row):
            fed = {src for s in steps for src in s["feeds"].values()}
            for i, s in enumerate(steps):
                if i in fed or not isinstance(s["output"], dict):
                    continue
                for v in s["output"].values():
                    if isinstance(v, str) and len(v) > 120:
                        long_texts += 1
                        assert any(v[:40] in r for r in replies), (row["id"], v[:60])
    assert long_texts > 0  # cat / diff / sort results were among them


def test_a_random_perturbation_is_caught(rows):
    """A kept row whose closing reply is replaced fails the check it passed (the check reads the reply)."""
    rng = random.Random(0)

    def says_something(row) -> bool:  # every turn's last call returned a non-empty text
        traces = json.loads(row["provenance"]["trace"])
        outs = [t["steps"][-1]["output"] for t in traces if t["steps"]]
        return bool(outs) and all(
            isinstance(o, dict) and any(isinstance(v, str) and v for v in o.values()) for o in outs
        )

    row = rng.choice([r for r in rows if says_something(r)])
    spec = get_env(row["provenance"]["env"])
    assert check_row(row, spec) == []
    bad = copy.deepcopy(row)
    for m in bad["messages"]:
        if m["role"] == "assistant" and not m["tool_calls"]:
            m["content"] = "<think>done</think>\nAll done. There was nothing else to report."
    assert "unreported_result" in check_row(bad, spec)
