"""Unit and fuzz tests of `fc_binary` (format, multiset matching, never raising)."""

from __future__ import annotations

import random
import string

from palaestra.egpo.reward import fc_binary
from palaestra.egpo.tasks import FCTask
from palaestra.shared.rewards import REWARDS, score
from palaestra.shared.toolcall import ToolCall, format_calls

TOOLS = [
    {
        "name": "get_weather",
        "parameters": {
            "type": "dict",
            "required": ["city"],
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
    {
        "name": "convert",
        "parameters": {
            "type": "dict",
            "required": ["amount"],
            "properties": {"amount": {"type": "float"}, "to": {"type": "array", "items": {"type": "string"}}},
        },
    },
]
TASK = FCTask(
    "t",
    [{"role": "user", "content": "weather in Paris and Rome"}],
    TOOLS,
    [
        {"get_weather": {"city": ["Paris", "Paris, France"], "unit": ["", "celsius"]}},
        {"get_weather": {"city": ["Rome"], "unit": ["", "celsius"]}},
    ],
)


def answer(*calls, think="plan"):
    return format_calls([ToolCall(n, a) for n, a in calls], thinking=think)


def test_registered_and_via_entry_point_module():
    assert REWARDS.get("fc_binary") is fc_binary
    assert score(fc_binary, TASK, answer(("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Paris"})))[0] == 1


def test_parallel_calls_are_order_free_and_values_bfcl_style():
    assert fc_binary(TASK, answer(("get_weather", {"city": "Rome"}), ("get_weather", {"city": "paris,france"})))[0] == 1
    assert (
        fc_binary(
            TASK, answer(("get_weather", {"city": "Rome", "unit": "Celsius"}), ("get_weather", {"city": "Paris"}))
        )[0]
        == 1
    )


def test_wrong_answers_score_zero():
    ok = [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Paris"})]
    assert fc_binary(TASK, answer(*ok))[0] == 1.0
    assert fc_binary(TASK, answer(*ok[:1]))[0] == 0.0  # dropped call
    assert fc_binary(TASK, answer(*ok, ok[0]))[0] == 0.0  # extra call
    assert fc_binary(TASK, answer(ok[0], ("get_weather", {"city": "Berlin"})))[0] == 0.0
    assert fc_binary(TASK, answer(ok[0], ("get_weather", {"city": "Paris", "days": 3})))[0] == 0.0  # not in truth
    assert fc_binary(TASK, answer(ok[0], ("get_weather", {"city": "Paris", "unit": "kelvin"})))[0] == 0.0
    assert fc_binary(TASK, answer(ok[0], ("weather", {"city": "Paris"})))[0] == 0.0


def test_format_is_required():
    ok = [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Paris"})]
    assert fc_binary(TASK, answer(*ok, think=None))[0] == 0.0  # no <think>
    assert fc_binary(TASK, answer(*ok, think=None), require_think=False)[0] == 1.0
    assert fc_binary(TASK, answer(*ok) + "\n<tool_call>{broken</tool_call>")[0] == 0.0


def test_types_follow_bfcl():
    task = FCTask("c", [], TOOLS, [{"convert": {"amount": [10.0], "to": [["EUR", "USD"]]}}])
    assert fc_binary(task, answer(("convert", {"amount": 10, "to": ["eur", "usd"]})))[0] == 1.0  # int ok for float
    assert fc_binary(task, answer(("convert", {"amount": "10", "to": ["EUR", "USD"]})))[0] == 0.0
    assert fc_binary(task, answer(("convert", {"amount": 10.0, "to": ["USD", "EUR"]})))[0] == 0.0  # list order
    assert fc_binary(task, answer(("convert", {"amount": True, "to": ["EUR", "USD"]})))[0] == 0.0


def test_no_call_due():
    task = FCTask("i", [], TOOLS, [])
    assert fc_binary(task, "<think>no tool fits</think>I cannot help with that.")[0] == 1.0
    assert fc_binary(task, answer(("get_weather", {"city": "Rome"})))[0] == 0.0


def test_never_raises_on_random_text():
    rng = random.Random(1)
    pieces = [
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        '{"name": "get_weather", "arguments": ',
        '{"city": "Rome"}}',
        "{",
        "}",
        '"',
        "\n",
        "null",
        "[1, 2]",
    ]
    for _ in range(2000):
        parts = [
            rng.choice(pieces) if rng.random() < 0.6 else "".join(rng.choices(string.printable, k=5))
            for _ in range(rng.randint(0, 12))
        ]
        value, info = fc_binary(TASK, "".join(parts))
        assert value in (0.0, 1.0) and isinstance(info["reason"], str)


def test_never_raises_on_odd_json_and_samples():
    rng = random.Random(0)
    values = [None, 1, -1.5, "x", [], {}, [1, "a"], {"a": [1]}, True, 1e308, "Paris"]
    for _ in range(500):
        args = {rng.choice(["city", "unit", "days", "amount", "to", "zzz"]): rng.choice(values) for _ in range(3)}
        text = answer((rng.choice(["get_weather", "convert", ""]), args))
        assert fc_binary(TASK, text)[0] in (0.0, 1.0)
    for sample in (None, {}, {"ground_truth": "garbage", "tools": 3}, {"ground_truth": [{"f": 1}]}, 42):
        assert fc_binary(sample, answer(("get_weather", {"city": "Rome"})))[0] == 0.0
    assert fc_binary(TASK, None)[0] == 0.0


WRAPPERS = {
    "between </think> and the calls": lambda think, calls: f"<think>{think}</think>\nSure, calling now.\n{calls}",
    "between the calls": lambda think, calls: (
        f"<think>{think}</think>\n" + calls.replace("</tool_call>", "</tool_call> and", 1)
    ),
    "after the calls": lambda think, calls: f"<think>{think}</think>\n{calls}\nHope this helps!",
    "text before <think>": lambda think, calls: f"Okay. <think>{think}</think>\n{calls}",
}


def test_strict_format_pays_nothing_for_text_around_the_calls():
    from palaestra.egpo.reward import fc_binary_lenient

    ok = [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Paris"})]
    calls = format_calls([ToolCall(n, a) for n, a in ok])  # the two blocks, no think
    clean = f"<think>plan</think>\n{calls}"
    assert fc_binary(TASK, clean)[0] == 1.0
    spaced = calls.replace("\n<tool_call>", "\n\n\n<tool_call>")
    assert fc_binary(TASK, f"<think>plan</think>\n\n  {spaced}\n")[0] == 1.0  # whitespace is not text
    for where, wrap in WRAPPERS.items():
        text = wrap("plan", calls)
        value, info = fc_binary(TASK, text)
        assert value == 0.0 and info["reason"].startswith("format:"), (where, info)
        # the lenient option pays for the right calls whatever surrounds them (not for text before <think>)
        assert fc_binary_lenient(TASK, text)[0] == (0.0 if where == "text before <think>" else 1.0), where
    # a plain answer where no call is due is text by definition: still 1 in the strict rule
    assert fc_binary(FCTask("i", [], TOOLS, []), "<think>no tool fits</think>\nI cannot help with that.")[0] == 1.0
    # strict and lenient agree that wrong calls in a clean wrapper score 0
    wrong = f"<think>plan</think>\n{format_calls([ToolCall('get_weather', {'city': 'Oslo'})])}"
    assert fc_binary(TASK, wrong)[0] == fc_binary_lenient(TASK, wrong)[0] == 0.0
