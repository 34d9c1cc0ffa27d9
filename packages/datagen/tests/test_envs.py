"""Environments: BFCL's eight load with their docs; reset/copy; execution never raises; user envs validated."""

from __future__ import annotations

import pytest

from palaestra.datagen.envs import BFCL_CLASSES, ApiEnvSpec, ToolEnv, get_env, register_env
from palaestra.datagen.schema import SchemaError, to_openai_tool

# function counts as DESIGN.md lists them for bfcl-eval's multi-turn docs
EXPECTED = {
    "GorillaFileSystem": 18,
    "MathAPI": 17,
    "MessageAPI": 10,
    "TwitterAPI": 14,
    "TicketAPI": 9,
    "TradingBot": 20,
    "TravelAPI": 18,
    "VehicleControlAPI": 22,
}


def test_bfcl_envs_load_with_their_docs():
    assert set(BFCL_CLASSES) == set(EXPECTED)
    for name, n in EXPECTED.items():
        spec = get_env(name)
        assert len(spec.tool_names) == n
        spec.check_methods()
        assert len(spec.scenarios) >= 1
        for tool in spec.openai_tools():
            assert tool["function"]["parameters"]["type"] == "object"


def test_reset_and_copy_are_independent():
    env = ToolEnv(get_env("TwitterAPI"), 0)
    fork = env.copy()
    assert fork.execute(
        "authenticate_twitter", {"username": env.instance.username, "password": env.instance.password}
    ).ok
    assert fork.execute("post_tweet", {"content": "hello"}).ok
    assert env.public_state() != fork.public_state()
    assert not env.instance.authenticated
    fork.reset()
    assert fork.public_state() == env.public_state()


def test_execution_never_raises():
    env = ToolEnv(get_env("MathAPI"))
    assert not env.execute("divide", {"a": 1.0, "b": 0.0}).ok
    bad = env.execute("add", {"a": 1.0, "nonsense": 2})
    assert not bad.ok and "TypeError" in bad.error
    assert not env.execute("no_such_tool", {}).ok


class Exploding:
    """A user environment whose tools misbehave."""

    def _load_scenario(self, config):
        self.count = config.get("count", 0)

    def boom(self):
        raise RuntimeError("kaboom")

    def leave(self):
        raise SystemExit(3)

    def bump(self, by: int):
        self.count += by
        return {"count": self.count}


DOCS = [
    {"name": "boom", "description": "Explodes.", "parameters": {"type": "dict", "properties": {}}},
    {"name": "leave", "description": "Exits.", "parameters": {"type": "dict", "properties": {}}},
    {
        "name": "bump",
        "description": "Adds.",
        "parameters": {"type": "dict", "properties": {"by": {"type": "integer"}}, "required": ["by"]},
    },
]


def test_user_env_that_raises_is_contained():
    spec = register_env(ApiEnvSpec("ExplodingTest", Exploding, DOCS, [{"count": 1}]))
    env = ToolEnv(spec)
    assert "kaboom" in env.execute("boom").error
    assert not env.execute("leave").ok
    assert env.execute("bump", {"by": 2}).output == {"count": 3}
    assert get_env("ExplodingTest") is spec


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"description": "x"}, "valid 'name'"),
        ({"name": "f", "parameters": {"type": "dict", "properties": {"a": {"type": "banana"}}}}, "unknown type"),
        ({"name": "f", "parameters": {"type": "dict", "properties": {}, "required": ["a"]}}, "unknown parameters"),
        ("not a dict", "mapping"),
    ],
)
def test_invalid_schemas_are_clear_errors(doc, message):
    with pytest.raises(SchemaError, match=message):
        ApiEnvSpec("Bad", Exploding, [doc])


def test_documented_tool_without_method_is_refused():
    docs = DOCS + [{"name": "ghost", "description": "none", "parameters": {"type": "dict", "properties": {}}}]
    with pytest.raises(SchemaError, match="ghost"):
        register_env(ApiEnvSpec("GhostTest", Exploding, docs))


def test_bfcl_types_become_json_schema():
    tool = to_openai_tool(get_env("TicketAPI").doc("edit_ticket"))
    assert tool["function"]["parameters"]["properties"]["updates"]["type"] == "object"


class Library:
    """The README's example environment, plus a lookup that feeds the borrow call."""

    def _load_scenario(self, config):
        self.books = dict(config.get("books", {}))
        self.loans = []

    def find_book(self, keyword: str):
        hits = [t for t in self.books if keyword.lower() in t.lower()]
        return {"title": hits[0]} if hits else {"error": f"no book matches {keyword}"}

    def borrow(self, title: str):
        if self.books.get(title, 0) < 1:
            return {"error": f"{title} is not available"}
        self.books[title] -= 1
        self.loans.append(title)
        return {"remaining": self.books[title]}


LIBRARY_DOCS = [
    {
        "name": "find_book",
        "description": "Find a book by keyword.",
        "parameters": {"type": "object", "properties": {"keyword": {"type": "string"}}, "required": ["keyword"]},
        "response": {"type": "object", "properties": {"title": {"type": "string"}}},
    },
    {
        "name": "borrow",
        "description": "Borrow a book.",
        "parameters": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
        "response": {"type": "object", "properties": {"remaining": {"type": "integer"}}},
    },
]


def test_user_environment_runs_through_the_pipeline():
    import json

    from palaestra.datagen.graph import ApiGraph
    from palaestra.datagen.pipeline import ItemConfig, RolesConfig, generate_item, make_roles

    spec = register_env(
        ApiEnvSpec(
            "LibraryTest",
            Library,
            LIBRARY_DOCS,
            [{"books": {"Dune": 2, "Emma": 1}}],
            arg_hints={"keyword": lambda inst, rng, chosen: ["dune", "emm"]},
        )
    )
    graph = ApiGraph()
    graph.add_env(spec)
    assert ["title", "title"] in graph.g.get_edge_data("LibraryTest.find_book", "LibraryTest.borrow")["mappings"]
    roles, _ = make_roles(RolesConfig())
    kept = 0
    for i in range(6):
        item = {"id": f"lib{i}", "env": "LibraryTest", "target": "borrow", "seed": i, "scenario": 0, "round": 0}
        out = generate_item(item, graph, roles, ItemConfig(max_turns=1, p_miss_func=0, p_miss_param=0))
        if out["sample"] is None:
            continue
        kept += 1
        env = ToolEnv(spec)
        for step in json.loads(out["sample"]["provenance"]["trace"])[0]["steps"]:
            assert env.execute(step["name"], step["arguments"]).output == step["output"]
    assert kept >= 4
