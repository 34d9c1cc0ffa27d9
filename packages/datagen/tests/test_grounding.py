"""Groundedness verifier, error conventions of the eight environments, miss_func / miss_param turns."""

from __future__ import annotations

import json
import random
import re

import pytest

from palaestra.datagen.envs import BFCL_CLASSES, ToolEnv, get_env, is_error_response
from palaestra.datagen.generate import build_graph
from palaestra.datagen.grounding import stated, verify_row
from palaestra.datagen.pipeline import ItemConfig, RolesConfig, generate_item, make_roles

# (environment, state, call, arguments, convention): each is a real failure of a BFCL environment
FAILURES = [
    ("MathAPI", {}, "divide", {"a": 1.0, "b": 0.0}, "error key"),
    ("GorillaFileSystem", None, "cat", {"file_name": "no_such_file.txt"}, "error key"),
    ("TradingBot", {"authenticated": False}, "get_watchlist", {}, "list of 'Error:' strings"),
    ("TradingBot", None, "get_symbol_by_name", {"name": "Nonexistent Co"}, "'not found' text"),
    ("TradingBot", {"authenticated": False}, "trading_logout", {}, "'No user is currently logged in'"),
    ("TicketAPI", {"current_user": None}, "get_user_tickets", {}, "list of error dicts"),
    ("TicketAPI", {"current_user": None}, "logout", {}, "success False"),
    ("TwitterAPI", None, "authenticate_twitter", {"username": "x", "password": "wrong"}, "*_status False"),
    ("MessageAPI", None, "message_login", {"user_id": "USR999"}, "login_status False + 'not found'"),
    (
        "TravelAPI",
        None,
        "verify_traveler_information",
        {"first_name": "No", "last_name": "Body", "date_of_birth": "1990-01-01", "passport_number": "US1"},
        "verification_status False",
    ),  # fmt: skip
    ("VehicleControlAPI", None, "startEngine", {"ignitionMode": "START"}, "error key"),
]


def _env(name, overrides):
    from palaestra.datagen.initial_states import generate_state

    state = generate_state(name, 0)
    state.update(overrides or {})
    return ToolEnv(get_env(name), state)


@pytest.mark.parametrize(("env", "state", "call", "args", "convention"), FAILURES, ids=[f[4] + f[0] for f in FAILURES])
def test_every_error_convention_is_a_failed_call(env, state, call, args, convention):
    ex = _env(env, state).execute(call, args)
    assert not ex.ok, (convention, ex.output)


def test_status_queries_are_not_errors():
    assert _env("TradingBot", {"authenticated": False}).execute("trading_get_login_status").ok
    assert _env("MessageAPI", {"current_user": None}).execute("message_get_login_status").ok
    assert not is_error_response({"login_status": False})
    assert is_error_response("Error: no") and is_error_response(["Error: x"]) and not is_error_response(["ok"])


@pytest.mark.parametrize(
    ("value", "text", "param", "ok"),
    [
        ("notes.txt", "Open 'notes.txt' please.", "file_name", True),
        ("notes.txt", "Open the notes please.", "file_name", False),
        (227.16, "at a price of 227.16 dollars", "price", True),
        (10.0, "buy 10 shares", "amount", True),
        (10.0, "buy 100 shares", "amount", False),
        (True, "set human readable: yes", "human_readable", True),
        (True, "yes, show the disk usage", "human_readable", False),
        (["@a", "@b"], "mention @a and @b", "mentions", True),
        (["@a", "@b"], "mention @a", "mentions", False),
        ("..", "go to '..'", "folder", True),
    ],
)
def test_stated(value, text, param, ok):
    assert stated(value, text, param) is ok


def _row(query, calls, outputs, env="TicketAPI"):
    spec = get_env(env)
    return {
        "turns": [{"kind": "normal", "query": query, "ground_truth": calls}],
        "messages": [{"role": "user", "content": query}],
        "tools": json.dumps(spec.openai_tools()),
        "missed_function": [],
        "provenance": {
            "trace": json.dumps([{"steps": [{"name": c.split("(")[0], "output": o} for c, o in zip(calls, outputs)]}])
        },
    }, spec


def test_verifier_accepts_stated_produced_and_default_values():
    row, spec = _row(
        "Create a ticket titled 'Fan noise', then close it.",
        ["create_ticket(title='Fan noise', priority=1)", "close_ticket(ticket_id=4102)"],
        [{"id": 4102, "title": "Fan noise"}, {"status": "Ticket 4102 has been closed successfully."}],
    )
    assert verify_row(row, spec) == []  # title stated, priority=1 the documented default, ticket_id produced


def test_verifier_rejects_unstated_ambiguous_and_error_steps():
    row, spec = _row(
        "Create a ticket, then close it.",
        ["create_ticket(title='Fan noise', priority=1)", "close_ticket(ticket_id=4102)"],
        [{"id": 4102}, {"status": "ok"}],
    )
    assert verify_row(row, spec) == ["ungrounded_argument"]  # the title was never said
    row, spec = _row(
        "List my tickets and close one.",
        ["get_user_tickets()", "close_ticket(ticket_id=4102)"],
        [[{"id": 4102}, {"id": 4107}], {"status": "ok"}],
    )
    assert verify_row(row, spec) == ["ambiguous_choice"]  # one of two ids, picked by chance
    row, spec = _row("Close ticket 4102.", ["close_ticket(ticket_id=4102)"], [{"error": "Ticket not found"}])
    assert verify_row(row, spec) == ["error_response"]


def test_superlative_singles_out_one_record():
    from palaestra.datagen.argfill import superlative

    tickets = [{"id": 4102, "priority": 2}, {"id": 4107, "priority": 5}, {"id": 4111, "priority": 3}]
    spec = {"type": "integer", "description": "ID of the ticket."}
    assert superlative(4107, tickets, "ticket_id", spec) == ("id", "priority", "highest")
    assert superlative(4102, tickets, "ticket_id", spec) == ("id", "priority", "lowest")
    assert superlative(4111, tickets, "ticket_id", spec) is None  # neither highest nor lowest
    tied = [{"id": 1, "priority": 5}, {"id": 2, "priority": 5}]
    assert superlative(1, tied, "ticket_id", spec) is None
    assert superlative(4102, tickets[:1], "ticket_id", spec) is None  # one record: no choice to make


def test_verifier_accepts_a_choice_the_query_resolves():
    listed = [{"id": 4102, "priority": 2}, {"id": 4107, "priority": 5}]
    calls = ["get_user_tickets()", "close_ticket(ticket_id=4107)"]
    row, spec = _row("List my tickets and close the one with the highest priority.", calls, [listed, {"status": "ok"}])
    assert verify_row(row, spec) == []
    row, spec = _row("List my tickets and close one of them.", calls, [listed, {"status": "ok"}])
    assert verify_row(row, spec) == ["ambiguous_choice"]
    calls = ["get_user_tickets()", "close_ticket(ticket_id=4102)"]  # the lowest, while the query says highest
    row, spec = _row("List my tickets and close the one with the highest priority.", calls, [listed, {"status": "ok"}])
    assert verify_row(row, spec) == ["ambiguous_choice"]


@pytest.fixture(scope="module")
def graph():
    return build_graph(list(BFCL_CLASSES), 0)


def _first_kept(env, graph, cfg, kind, tries=40):
    roles, _ = make_roles(RolesConfig())
    tools = graph.tools(env)
    for seed in range(tries):
        target = tools[seed % len(tools)]
        item = {"id": f"t{seed}", "env": env, "target": target, "seed": seed, "scenario": seed, "round": 0}
        out = generate_item(item, graph, roles, cfg)
        if out["sample"] and any(t["kind"] == kind for t in out["sample"]["turns"]):
            return out["sample"]
    raise AssertionError(f"no {kind} sample for {env} in {tries} tries")


@pytest.mark.parametrize("env", list(BFCL_CLASSES))
def test_miss_func_turn_is_right_in_every_environment(env, graph):
    cfg = ItemConfig(p_miss_func=1.0, p_miss_param=0.0, min_turns=2, max_turns=2)
    row = _first_kept(env, graph, cfg, "miss_func")
    (missed,) = row["missed_function"]
    (name,) = missed["functions"]
    listed = {t["function"]["name"] for t in json.loads(row["tools"])}
    assert name not in listed  # the withheld function is not among the tools the model sees
    k = [t["kind"] for t in row["turns"]].index("miss_func")
    assert row["turns"][k]["ground_truth"] == [] and row["turns"][k + 1]["kind"] == "func_added"
    assert missed["turn"] == k + 1
    assert any(c.startswith(name + "(") for c in row["turns"][k + 1]["ground_truth"])  # the turn really needs it
    assert not any(c.startswith(name + "(") for t in row["turns"][:k] for c in t["ground_truth"])
    # the conversation: no call answers the miss_func turn; a system message brings the function's schema
    users = [i for i, m in enumerate(row["messages"]) if m["role"] == "user"]
    reply = row["messages"][users[k] + 1]
    assert reply["role"] == "assistant" and not reply["tool_calls"]
    system = [m for m in row["messages"] if m["role"] == "system"]
    assert len(system) == 1 and json.loads(system[0]["content"].split(": ", 1)[1])["name"] == name


@pytest.mark.parametrize("env", ["GorillaFileSystem", "MessageAPI", "TwitterAPI", "TravelAPI"])
def test_miss_param_reply_asks_for_the_missing_parameter(env, graph):
    cfg = ItemConfig(p_miss_func=0.0, p_miss_param=1.0, min_turns=1, max_turns=2)
    row = _first_kept(env, graph, cfg, "miss_param")
    k = [t["kind"] for t in row["turns"]].index("miss_param")
    missing = row["turns"][k]["missing"]
    value = row["turns"][k + 1]["missing_value"]
    users = [i for i, m in enumerate(row["messages"]) if m["role"] == "user"]
    reply = row["messages"][users[k] + 1]
    assert not reply["tool_calls"]
    answer = reply["content"].split("</think>")[-1]
    # it names the parameter: its words ("include removed" for includeRemoved) or the noun phrase of its
    # description ("zipcode of the second city" for cityB)
    said = " ".join(re.findall(r"[a-z0-9]+", answer.lower()))
    names = {re.sub(r"([a-z])([A-Z])", r"\1 \2", missing).replace("_", " ").lower()}
    for tool in json.loads(row["tools"]):
        desc = tool["function"]["parameters"]["properties"].get(missing, {}).get("description", "")
        names.add(re.sub(r"^(the|a|an) ", "", re.split(r"[.,;(]", desc.lower())[0].strip()))
    assert "?" in answer and any(n and n in said for n in names), (answer, names)
    # the value was not said before the question, and the next user turn gives it
    before = " ".join(m["content"] for m in row["messages"][: users[k] + 1])
    assert str(value) not in before
    assert str(value) in row["messages"][users[k + 1]]["content"]
    # the check can fail: a reply that does not ask is rejected by the verifier
    bad = json.loads(json.dumps(row))
    bad["messages"][users[k] + 1]["content"] = "Sure, done."
    assert "miss_param_reply" in verify_row(bad, get_env(env))


def test_generated_samples_pass_the_verifier_and_vary(graph):
    roles, _ = make_roles(RolesConfig())
    rng = random.Random(0)
    queries = []
    for i in range(16):
        env = list(BFCL_CLASSES)[i % 8]
        item = {"id": f"v{i}", "env": env, "target": rng.choice(graph.tools(env)), "seed": i, "scenario": i, "round": 0}
        out = generate_item(item, graph, roles, ItemConfig())
        if out["sample"]:
            assert verify_row(out["sample"], get_env(env)) == []
            queries.append(out["sample"]["turns"][0]["query"])
    assert len(queries) >= 12
    assert len({q.split()[0] for q in queries}) >= 3  # several phrasings, not one template
    assert not any("; then " in q for q in queries)  # no step list ("Please <step>; then <step>")


class Shop:
    """A test environment whose listing returns several records: a later call must pick one of them."""

    def _load_scenario(self, config):
        self.orders = {o["order_id"]: dict(o) for o in config["orders"]}

    def list_orders(self):
        return {"orders": [dict(o) for o in self.orders.values()]}

    def cancel_order(self, order_id: int):
        if order_id not in self.orders:
            return {"error": f"no order {order_id}"}
        self.orders[order_id]["status"] = "cancelled"
        return {"cancelled": order_id}


SHOP_DOCS = [
    {
        "name": "list_orders",
        "description": "List all orders.",
        "parameters": {"type": "object", "properties": {}, "required": []},
        "response": {
            "type": "object",
            "properties": {
                "orders": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"order_id": {"type": "integer"}, "total": {}}},
                }
            },
        },
    },
    {
        "name": "cancel_order",
        "description": "Cancel an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "integer", "description": "The order id."}},
            "required": ["order_id"],
        },
    },
]


def _shop_state(seed):
    rng = random.Random(seed)
    ids = rng.sample(range(1000, 9999), k=3)
    totals = rng.sample(range(10, 500), k=3)  # distinct: one highest, one lowest
    return {"orders": [{"order_id": i, "total": float(t), "status": "open"} for i, t in zip(ids, totals)]}


def test_sampler_picks_one_of_several_records_by_a_criterion_the_query_states():
    from palaestra.datagen.envs import ApiEnvSpec, register_env
    from palaestra.datagen.graph import ApiGraph

    try:
        spec = register_env(ApiEnvSpec("ShopTest", Shop, SHOP_DOCS, state_generator=_shop_state))
    except ValueError:
        spec = get_env("ShopTest")
    graph = ApiGraph()
    graph.add_env(spec, probe=False)
    roles, _ = make_roles(RolesConfig(naive_first_try=0.0))
    cfg = ItemConfig(min_turns=1, max_turns=1, p_miss_func=0.0, p_miss_param=0.0)
    criteria = 0
    for seed in range(40):
        item = {
            "id": f"s{seed}",
            "env": "ShopTest",
            "target": "cancel_order",
            "seed": seed,
            "scenario": seed,
            "round": 0,
        }
        row = generate_item(item, graph, roles, cfg)["sample"]
        if row is None:
            continue
        assert verify_row(row, spec) == []
        for step in json.loads(row["provenance"]["trace"])[0]["steps"]:
            if step.get("selectors"):
                (sibling, which) = step["selectors"]["order_id"]
                query = row["turns"][0]["query"]
                assert f"the {which} {sibling}" in query, query
                # independently: the cancelled order is the one with that extreme total in the state
                orders = json.loads(row["initial_config"])["ShopTest"]["orders"]
                pick = (max if which == "highest" else min)(orders, key=lambda o: o[sibling])
                assert step["arguments"]["order_id"] == pick["order_id"]
                criteria += 1
    assert criteria >= 5
