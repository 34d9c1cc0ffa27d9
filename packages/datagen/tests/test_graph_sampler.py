"""API graph mined from schemas and executions; the directed sampler's legality and lengths."""

from __future__ import annotations

import random

import pytest

from palaestra.datagen.envs import BFCL_CLASSES, ToolEnv, get_env
from palaestra.datagen.graph import ApiGraph, node
from palaestra.datagen.sampler import sample_trace


@pytest.fixture(scope="module")
def graph():
    g = ApiGraph()
    for name in BFCL_CLASSES:
        g.add_env(get_env(name))
    return g


def test_prerequisites_found_by_execution(graph):
    # posting needs a login in BFCL's TwitterAPI scenarios: the probe must discover it by executing
    assert "authenticate_twitter" in graph.prerequisites("TwitterAPI", "post_tweet")
    assert graph.g.has_edge(node("TwitterAPI", "authenticate_twitter"), node("TwitterAPI", "post_tweet"))
    # an output-to-input mapping mined from the schemas: authenticate_travel's access_token feeds book_flight
    data = graph.g.get_edge_data(node("TravelAPI", "authenticate_travel"), node("TravelAPI", "book_flight"))
    assert ["access_token", "access_token"] in data["mappings"]


def test_sampler_respects_legality_and_lengths(graph):
    for name in BFCL_CLASSES:
        spec = get_env(name)
        for i, target in enumerate(spec.tool_names):
            rng = random.Random(i)
            length = 1 + i % 8
            trace, _ = sample_trace(ToolEnv(spec, i), graph, target, rng, length)
            assert 1 <= len(trace.steps) <= length
            called = set()
            for step in trace.steps:
                assert set(graph.prerequisites(name, step.name)) <= called, (name, step.name)
                called.add(step.name)
            # the target is taken as soon as it is legal (with no prerequisites: the first call), except that
            # one tool whose output can feed it (a mapping edge) may come right before it: a hidden step
            if not graph.prerequisites(name, target) and trace.target_hit:
                first = trace.steps[0].name
                assert first == target or (
                    trace.steps[1].name == target
                    and "mapping" in graph.g.edges[node(name, first), node(name, target)]["kinds"]
                ), (name, target, [s.name for s in trace.steps])


def test_every_traced_call_replays(graph):
    spec = get_env("TravelAPI")
    trace, after = sample_trace(ToolEnv(spec, 3), graph, "book_flight", random.Random(1), 6)
    fresh = ToolEnv(spec, 3)
    for step in trace.steps:
        assert fresh.execute(step.name, step.arguments).output == step.output
    assert fresh.same_state(after)


def test_graph_saved_with_picture(graph, tmp_path):
    paths = graph.save(tmp_path)
    assert {p.name for p in paths} == {"graph.json", "graph.png"}
    assert (tmp_path / "graph.png").stat().st_size > 10_000
    import json

    again = ApiGraph.from_dict(json.loads((tmp_path / "graph.json").read_text()))
    assert again.g.number_of_nodes() == 128
