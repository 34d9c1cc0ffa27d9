"""The task source ``fc_tasks`` (`TASKS`): single-turn function-calling samples for the ``task`` env and SFT.

From a JSONL file (datagen's output, xLAM/APIGen style, or explicit ground truth), from a BFCL category, or
generated in code (`palaestra.egpo.synthetic`); ``with_answers: true`` adds the reference answer to each sample,
which is what an SFT warm start (``sft_warmup.source: fc_tasks``) trains on. `task_sample` and `subset_tools` turn
one `FCTask` into a sample; the public sets' source (`palaestra.egpo.public_data`) uses them too.
"""

from __future__ import annotations

from typing import Any

from palaestra.egpo.tasks import FCTask, load_bfcl, load_jsonl
from palaestra.shared.rollout.tasks import TASKS
from palaestra.shared.toolcall import ToolCall, format_calls


@TASKS.register("fc_tasks")
def fc_tasks(
    path: str | None = None,
    bfcl_category: str | None = None,
    synthetic: int = 0,
    limit: int | None = None,
    with_answers: bool = False,
    seed: int = 0,
    compact_tools: bool = False,
    max_tools: int = 0,
    first_turn_only: bool = False,
    min_args: int = 0,
    think_args: bool = False,
) -> list[dict]:
    """Function-calling samples (``messages``, ``tools``, ``ground_truth``) for the ``task`` env and SFT.

    ``compact_tools``: list the tools as one short line each in the system prompt instead of the chat
    template's JSON block (about 400 tokens less per prompt; for tiny CPU runs). The reward then reads
    the schemas from ``tool_docs``.
    ``max_tools`` (0: all): offer at most this many tools per task: the ground truth's, then others of the
    task's list drawn at random (seeded per task); the prompt stays in the chat template's JSON format and
    shrinks from a whole environment's docs (1-3k tokens in datagen's output) to a few hundred tokens.
    ``first_turn_only``: of a multi-turn record, keep only the task of its first user turn (the later ones
    carry the whole conversation so far in their prompt).
    ``min_args``: keep only tasks whose every expected call passes at least this many arguments (tasks with
    no call are dropped too when > 0): SFT data that shows argument filling, not calls with 0 or 1 argument.
    ``think_args``: the reference thought of ``with_answers`` names the arguments each call fills
    ("Call f with a, b.") instead of the function only."""
    from palaestra.egpo.synthetic import synthetic_tasks

    tasks: list[FCTask] = []
    if path:
        tasks += [t for t in load_jsonl(path, limit) if not first_turn_only or _user_turns(t) == 1]
    if bfcl_category:
        tasks += load_bfcl(bfcl_category, limit)
    if synthetic:
        tasks += synthetic_tasks(synthetic, seed=seed)
    if not tasks:
        raise ValueError("fc_tasks: no tasks; set path (JSONL), bfcl_category or synthetic (a count)")
    if max_tools < 0:
        raise ValueError(f"fc_tasks: max_tools must be >= 0, got {max_tools}")
    if min_args < 0:
        raise ValueError(f"fc_tasks: min_args must be >= 0, got {min_args}")
    if min_args:
        tasks = [t for t in tasks if t.ground_truth and min(_given_args(t)) >= min_args]
        if not tasks:
            raise ValueError(f"fc_tasks: no task has calls with at least {min_args} arguments")
    if max_tools:
        tasks = [subset_tools(t, max_tools, seed) for t in tasks]
    return [task_sample(t, with_answers, compact_tools, think_args) for t in tasks]


def _given_args(task: FCTask) -> list[int]:
    """Arguments each call of the task's reference answer passes (`canonical_calls`)."""
    from palaestra.egpo.tasks import canonical_calls

    return [len(c["arguments"]) for c in canonical_calls(task.ground_truth, task.tools)]


def _user_turns(task: FCTask) -> int:
    return sum(m.get("role") == "user" for m in task.messages)


def subset_tools(task: FCTask, max_tools: int, seed: int = 0) -> FCTask:
    """`task` with its tools cut to the ground truth's plus random others, `max_tools` in all (at least the
    ground truth's)."""
    import dataclasses
    import random

    from palaestra.egpo.tasks import tool_doc

    needed = {name for call in task.ground_truth for name in call}
    keep = [t for t in task.tools if tool_doc(t).get("name") in needed]
    others = [t for t in task.tools if tool_doc(t).get("name") not in needed]
    random.Random(f"{seed}:{task.id}").shuffle(others)
    keep += others[: max(0, max_tools - len(keep))]
    order = {id(t): i for i, t in enumerate(task.tools)}
    return dataclasses.replace(task, tools=sorted(keep, key=lambda t: order[id(t)]))


def compact_signature(tool: dict) -> str:
    """``name(param: type, ...)`` of a tool."""
    doc = tool.get("function", tool)
    props = (doc.get("parameters") or {}).get("properties") or {}
    params = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in props.items())
    return f"{doc['name']}({params})"


def task_sample(
    task: FCTask, with_answer: bool = False, compact_tools: bool = False, think_args: bool = False
) -> dict[str, Any]:
    from palaestra.egpo.synthetic import reference_thinking
    from palaestra.egpo.tasks import canonical_calls

    messages = task.prompt_messages()
    if with_answer:
        calls = [ToolCall(c["name"], c["arguments"]) for c in canonical_calls(task.ground_truth, task.tools)]
        content = "I cannot help with that using these tools." if not calls else ""
        text = format_calls(calls, thinking=reference_thinking(task, think_args), content=content)
        messages = [*messages, {"role": "assistant", "content": text}]
    sample: dict[str, Any] = {
        "id": task.id,
        "messages": messages,
        "tools": task.chat_tools(),
        "ground_truth": task.ground_truth,
        "category": task.category,
    }
    if compact_tools:
        listing = "Tools: " + "; ".join(compact_signature(t) for t in task.tools)
        system = {"role": "system", "content": f"{messages[0]['content']}\n{listing}"}
        sample.update({"messages": [system, *messages[1:]], "tools": None, "tool_docs": sample["tools"]})
    return sample
