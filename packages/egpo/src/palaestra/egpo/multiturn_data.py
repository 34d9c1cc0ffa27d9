"""Datagen's multi-turn rows as training episodes in BFCL's executable environments (the FunReason-MT setting).

A datagen row (``packages/datagen``'s ``samples.jsonl``) carries what one BFCL multi-turn entry carries:
``initial_config`` (JSON text), ``involved_classes``, ``tools`` (JSON text or a list of function docs),
``turns`` (one user query per turn, ``kind`` normal / miss_func / func_added / miss_param / param_given),
``ground_truth`` (BFCL call strings per turn) and ``missed_function`` (``[{"turn": k, "functions": [names]}]``:
held out of the tools until turn k). `entry_from_row` turns it into BFCL's entry form (``question`` per
turn, ``function`` without the held-out docs, ``missed_function`` ``{"k": [docs]}``), which
`palaestra.egpo.multiturn.BFCLMultiTurnEnv` plays exactly as it plays BFCL's own entries: the model's calls
run on this episode's instances, tool results come back, a response without calls ends the user turn.

The env ``datagen_multi_turn`` (`ENVS`) plays row ``seed % count`` per episode through the shared multi-turn
rollout. With ``reward_per_turn`` (default) each user turn is rewarded when it ends: 1/T if BFCL's
``multi_turn_checker`` accepts the episode up to and including that turn (state and results), else 0; the
episode's total is then the share of turns right before the first wrong one (1.0 iff BFCL accepts the whole
episode). Without it: 1.0 or 0.0 at the end. ``max_tools`` keeps the tools the ground truth calls plus
random others (the prompt of a whole environment's docs is 1-3k tokens).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from palaestra.egpo.tasks import parse_json_field, tool_doc
from palaestra.shared.jsonl import read_jsonl
from palaestra.shared.rollout.env import ENVS


def entry_from_row(row: dict, index: int, max_tools: int = 0, seed: int = 0) -> tuple[dict, list[list[str]]]:
    """BFCL's multi-turn entry form and ground truth of one datagen row."""
    for key in ("turns", "ground_truth", "initial_config", "involved_classes", "tools"):
        if key not in row:
            raise ValueError(f"row {index} has no {key!r} (not a datagen multi-turn row)")
    truth = row["ground_truth"]
    if len(truth) != len(row["turns"]) or not all(isinstance(t, list) for t in truth):
        raise ValueError(f"row {index}: ground_truth must be one list of call strings per turn")
    docs = [tool_doc(t) for t in parse_json_field(row["tools"], f"row {index} 'tools'")]
    held = {int(m["turn"]): list(m["functions"]) for m in row.get("missed_function") or []}
    held_names = {name for names in held.values() for name in names}
    called = {call.split("(", 1)[0].strip() for turn in truth for call in turn}
    if max_tools:
        others = [d["name"] for d in docs if d["name"] not in called | held_names]
        random.Random(f"{seed}:{index}").shuffle(others)
        keep = called | held_names | set(others[: max(0, max_tools - len(called | held_names))])
        docs = [d for d in docs if d["name"] in keep]
    by_name = {d["name"]: d for d in docs}
    entry = {
        # BFCL derives the category from the id's last "_": a datagen row is its own category
        "id": f"datagen_multi_turn_{index}",
        "question": [[{"role": "user", "content": t["query"]}] if t.get("query") else [] for t in row["turns"]],
        "function": [d for d in docs if d["name"] not in held_names],
        "initial_config": parse_json_field(row["initial_config"], f"row {index} 'initial_config'"),
        "involved_classes": list(row["involved_classes"]),
        "missed_function": {str(k): [by_name[n] for n in names if n in by_name] for k, names in held.items()},
    }
    return entry, [list(t) for t in truth]


def load_rows(
    path: str | Path, limit: int | None = None, max_tools: int = 0, seed: int = 0
) -> list[tuple[dict, list[list[str]]]]:
    """``(entry, ground_truth)`` of the multi-turn rows of a datagen JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"datagen file not found: {path}")
    out: list[tuple[dict, list[list[str]]]] = []
    for number, row in read_jsonl(path):
        out.append(entry_from_row(row, number - 1, max_tools, seed))
        if limit and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


@ENVS.register("datagen_multi_turn")  # type: ignore[arg-type]  # a factory of envs: the registry calls it
def datagen_multi_turn(
    path: str,
    limit: int | None = None,
    reward_per_turn: bool = True,
    max_tools: int = 0,
    max_steps: int = 20,
    seed: int = 0,
):
    """Datagen's multi-turn rows as episodes in BFCL's environments; ``reset(seed)`` plays row ``seed % count``."""
    from palaestra.egpo.multiturn import BFCLMultiTurnEnv

    pairs = load_rows(path, limit, max_tools, seed)

    class _Env(BFCLMultiTurnEnv):
        env_type = "datagen_multi_turn"
        num_tasks = len(pairs)  # for task_sampling: epochs (palaestra.shared.rl.task_sampling)

        def reset(self, seed: int | None = None) -> dict[str, Any]:
            self.entry, self.ground_truth = pairs[(seed or 0) % len(pairs)]
            return super().reset(seed)

    return _Env(*pairs[0], max_steps=max_steps, reward_per_turn=reward_per_turn)
