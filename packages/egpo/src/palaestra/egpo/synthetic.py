"""Small function-calling tasks generated in code (for CPU runs and tests when no datagen output is at hand).

Datagen-style: a handful of tools with JSON-schema docs, user queries written from templates, and the
ground-truth calls; single calls, parallel calls (two cities) and queries no tool fits (the right
answer is a plain reply). Short on purpose, so that the embedded ``tiny`` model can learn them on CPU.

>>> tasks = synthetic_tasks(4, seed=0)
>>> [t.category for t in tasks]
['single', 'convert', 'parallel', 'none']
"""

from __future__ import annotations

import random

from palaestra.egpo.tasks import FCTask, canonical_calls, exact_ground_truth

SHORT_SYSTEM_PROMPT = "Think in <think></think>, then call tools in <tool_call></tool_call>, or reply."

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {
        "name": "convert",
        "description": "Convert an amount of euros.",
        "parameters": {
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
            "required": ["amount", "to"],
        },
    },
]
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo"]
CURRENCIES = ["USD", "GBP", "JPY"]
CHATTER = ["Tell me a joke.", "Who are you?", "Say hello.", "What is love?"]


def synthetic_tasks(
    num: int = 64, seed: int = 0, kinds: tuple[str, ...] = ("single", "convert", "parallel", "none")
) -> list[FCTask]:
    """`num` tasks, kinds in turn: weather of one city, a conversion, two cities at once, no tool."""
    rng = random.Random(seed)
    tasks = []
    for i in range(num):
        kind = kinds[i % len(kinds)]
        if kind == "single":
            city = rng.choice(CITIES)
            query, calls = f"Weather in {city}?", [{"name": "get_weather", "arguments": {"city": city}}]
        elif kind == "convert":
            amount, to = rng.randint(1, 20), rng.choice(CURRENCIES)
            query, calls = (
                f"Convert {amount} euros to {to}.",
                [{"name": "convert", "arguments": {"amount": amount, "to": to}}],
            )
        elif kind == "parallel":
            a, b = rng.sample(CITIES, 2)
            query = f"Weather in {a} and {b}?"
            calls = [{"name": "get_weather", "arguments": {"city": c}} for c in (a, b)]
        else:
            query, calls = rng.choice(CHATTER), []
        messages = [{"role": "system", "content": SHORT_SYSTEM_PROMPT}, {"role": "user", "content": query}]
        tasks.append(FCTask(f"synthetic-{seed}-{i}", messages, TOOLS, exact_ground_truth(calls, TOOLS), kind))
    return tasks


def reference_thinking(task: FCTask, with_args: bool = False) -> str:
    """A short chain of thought for SFT answers: the functions to call (``with_args``: and the arguments
    each one fills, in the reference answer's order, e.g. "Call f with a, b.")."""
    if not task.ground_truth:
        return "No tool fits."
    if not with_args:
        return f"Call {' and '.join(next(iter(g)) for g in task.ground_truth)}."
    parts = []
    for call in canonical_calls(task.ground_truth, task.tools):
        args = ", ".join(call["arguments"])
        parts.append(f"{call['name']} with {args}" if args else f"{call['name']} with no arguments")
    return f"Call {' and '.join(parts)}."
