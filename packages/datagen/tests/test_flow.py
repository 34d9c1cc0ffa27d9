"""Goals whose steps feed each other: targets a producer can feed come first, later turns prefer a target an
earlier turn's call can feed (dependent turns), computed figures can flow, and the deterministic run's share
of traces with an output-to-input flow (counted here independently) stays above 12% now that goal coherence
(`coherence`) refuses flows out of state-changing calls and between values of different kinds."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest


@pytest.fixture(scope="module")
def ticket_graph():
    from palaestra.datagen.generate import build_graph

    return build_graph(["TicketAPI"])


def _fed(graph, env: str, tool: str) -> set[str]:
    """Tools with an edge carrying an output-to-input mapping into `tool`, read off the networkx graph."""
    return {u.split(".")[1] for u, v, d in graph.g.edges(data=True) if v == f"{env}.{tool}" and "mapping" in d["kinds"]}


def test_first_turn_targets_favour_tools_a_producer_can_feed(ticket_graph):
    """Smooth weighted round-robin over one full cycle of the weights allots each tool exactly its weight:
    3 for a tool some output can feed, 1 for the others (all node weights 1.0 in a fresh graph)."""
    from palaestra.datagen.generate import DataGenerationConfig, plan_items

    tools = ticket_graph.tools("TicketAPI")
    weight = {t: 3 if _fed(ticket_graph, "TicketAPI", t) else 1 for t in tools}
    assert 0 < sum(w == 3 for w in weight.values()) < len(tools)
    cycles = 5
    cfg = DataGenerationConfig(num_samples=cycles * sum(weight.values()), envs=["TicketAPI"])
    counts = Counter(it["target"] for it in plan_items(cfg, ticket_graph))
    assert counts == {t: cycles * w for t, w in weight.items()}


def test_later_turns_prefer_a_target_an_earlier_call_can_feed(ticket_graph):
    """P(tool) is proportional to weight x 3 (some output can feed it) x 5 (a tool called before can feed it)."""
    from palaestra.datagen.turnplan import weighted_tool

    tools = ticket_graph.tools("TicketAPI")
    after = {"create_ticket"}
    w = {
        t: (3 if _fed(ticket_graph, "TicketAPI", t) else 1) * (5 if _fed(ticket_graph, "TicketAPI", t) & after else 1)
        for t in tools
    }
    assert len(set(w.values())) == 3  # unfed, fed, fed by create_ticket: all three kinds occur
    rng = random.Random(0)
    n = 20000
    draws = Counter(weighted_tool(ticket_graph, "TicketAPI", rng, after=after) for _ in range(n))
    total = sum(w.values())
    for t in tools:
        p = w[t] / total
        assert abs(draws[t] / n - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-3, (t, draws[t] / n, p)


def test_a_computed_figure_can_flow_but_a_round_literal_cannot():
    from palaestra.datagen.sampler import _distinctive

    assert _distinctive(13.248935000000001) and _distinctive(3.785)  # only a tool computes these
    assert not _distinctive(2.5) and not _distinctive(7.0) and not _distinctive(42)  # a user says these too
    assert _distinctive(6804) and _distinctive("USR003")


def _scalars(v):
    if isinstance(v, list | tuple):
        return [x for y in v for x in _scalars(y)]
    if isinstance(v, dict):
        return [x for y in v.values() for x in _scalars(y)]
    return [v]


def _distinct(v) -> bool:
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, float) and not v.is_integer():
        return True
    if isinstance(v, int | float):
        return abs(v) >= 100
    return isinstance(v, str) and len(v) >= 4


def test_flow_share_of_the_deterministic_run(deterministic_run):
    """Of the sequential traces (turns with calls, not in one message), the share where a call takes a distinctive
    value an earlier step of the
    same turn returned and the turn's request does not say: 0.23 on this fixture (0.17 before dependent goals
    were favoured); counted from the rows' own traces, not by `quality`."""
    path, _ = deterministic_run
    traces = flows = 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        recorded = iter(json.loads(row["provenance"]["trace"]))
        batches = [[c["function"]["name"] for c in m["tool_calls"]] for m in row["messages"] if m.get("tool_calls")]
        for turn in row["turns"]:
            if not turn["ground_truth"]:
                continue
            steps = next(recorded)["steps"]
            if len(steps) > 1 and [f"{s['name']}" for s in steps] in batches:
                continue  # parallel calls (one message): independent goals, no flow between them by design
            traces += 1
            returned: list = []
            flow = False
            for step in steps:
                for value in _scalars(step["arguments"]):
                    if _distinct(value) and value in returned and str(value).lower() not in turn["query"].lower():
                        flow = True
                returned += _scalars(step["output"])
            flows += flow
    assert traces > 150
    # 0.23 before issue 39; 0.14 since a value read from a call that changed the state is refused (create a
    # ticket, then close it: a change the user did not ask for) and flows only go into arguments of their kind
    # 0.12 on this fixture since a later turn preferably takes an earlier turn's value (issue 39: `carry`) rather
    # than an in-turn producer's: in-turn flows 18% -> 14% of the sequential traces of deterministic.yaml,
    # cross-turn ones 12 -> 79 traces
    assert flows / traces >= 0.10, (flows, traces)
