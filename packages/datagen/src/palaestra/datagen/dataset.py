"""The emitted dataset: row schema, append-only JSONL with dedup, resume after a kill.

One JSON object per line (``datasets.load_dataset("json", data_files=...)``
reads it directly). Fields of a row:

- ``id`` (str): ``<name>-s<seed>-r<round>-<item index>`` (a rerun with another seed appends new items).
- ``messages`` (list): OpenAI-style chat, every message with the same keys
  ``role`` (user | assistant | tool | system), ``content`` (str; assistant
  turns start with ``<think>...</think>``), ``tool_calls`` (null, or a list of
  ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
  ``arguments`` a JSON string of keyword arguments), ``tool_call_id`` (str or
  null), ``name`` (tool name or null). A ``system`` message inside the chat
  marks the turn where a withheld function becomes available; it carries
  that function's JSON schema.
- ``tools`` (str): JSON list of OpenAI tool schemas: the environment's
  functions available from the first turn (a function withheld for a
  miss_func turn is not listed; the system message adds it). A JSON string
  because schemas differ from row to row.
- ``turns`` (list): per user turn ``{"kind", "query", "ground_truth",
  "hidden_steps"}``; ``kind`` in normal | miss_param | param_given |
  miss_func | func_added; ``ground_truth`` is a list of calls in BFCL syntax
  (``name(key=value, ...)``), empty where the right answer is not to call.
  ``missing`` (miss_param / param_given: the parameter; miss_func /
  func_added: the function) and ``missing_value`` (param_given) where they apply.
- ``ground_truth`` (list of lists of str): the same, per turn (BFCL's format).
- ``missed_function`` (list): ``{"turn", "functions"}``: functions withheld
  before that turn (BFCL's miss_func).
- ``initial_config`` (str): JSON ``{class: config}``, drawn by
  `initial_states` from ``provenance.state_seed``; ``involved_classes``
  (list of str): with the ground truth, a BFCL multi-turn test entry.
- ``provenance``: ``env``, ``state_seed``, ``seed``, ``round``,
  ``graph_version``, ``target``, ``roles`` (implementation per role),
  ``trace`` (JSON string: per turn the executed steps with outputs),
  ``advanced_tools`` (JSON string).
- ``difficulty``: ``num_calls``, ``hidden_steps``, ``num_turns``.
- ``verdict``: ``passed`` (always true: only verified samples are written),
  ``tries`` (tries the chain needed, summed over turns), ``checker``.

`SampleWriter` appends one line per sample with flush + fsync, skips
duplicates (normalized queries + ground-truth calls) and, given a threshold,
near-duplicates (`neardup`: the same calls, nearly the same words), and on open truncates a
torn last line left by a kill, so a resumed run neither loses, repeats nor
corrupts anything. Finished item ids live in ``<file>.done`` (kept and dropped
items alike), so a resumed run skips them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from palaestra.datagen.neardup import NearDuplicates


def _message(m: dict) -> dict:
    return {
        "role": m["role"],
        "content": m.get("content") or "",
        "tool_calls": m.get("tool_calls") or None,
        "tool_call_id": m.get("tool_call_id"),
        "name": m.get("name"),
    }


def make_row(item, spec, history, tools, turns, missed, traces, advanced, role_names, graph_version, chain_stats):
    tries = sum(chain_stats.get("tries", []))
    bfcl_class = spec.bfcl_class or spec.name
    return {
        "id": item["id"],
        "messages": [_message(m) for m in history],
        "tools": json.dumps(tools),
        "turns": turns,
        "ground_truth": [t["ground_truth"] for t in turns],
        "missed_function": missed,
        "initial_config": json.dumps({bfcl_class: spec.initial_state(item["scenario"])}),
        "involved_classes": [bfcl_class],
        "provenance": {
            "env": spec.name,
            "state_seed": item["scenario"],
            "seed": item["seed"],
            "round": item["round"],
            "graph_version": graph_version,
            "target": item["target"],
            "roles": role_names,
            "trace": json.dumps(traces, default=str),
            "advanced_tools": json.dumps(advanced),
        },
        "difficulty": {
            "num_calls": sum(len(t["steps"]) for t in traces),
            "hidden_steps": sum(t["hidden_steps"] for t in turns),
            "num_turns": len(turns),
        },
        "verdict": {"passed": True, "tries": tries, "checker": "replay: public state equal + ground-truth results"},
    }


def dedup_key(row: dict) -> str:
    queries = " | ".join(re.sub(r"[^a-z0-9 ]", "", " ".join(t["query"].lower().split())) for t in row["turns"])
    calls = json.dumps(row["ground_truth"])
    return hashlib.sha1(f"{queries}\n{calls}".encode()).hexdigest()


class SampleWriter:
    """Append-only JSONL writer with dedup and crash-safe resume."""

    def __init__(self, path: str | Path, near_duplicate_threshold: float | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done_path = self.path.with_suffix(self.path.suffix + ".done")
        self.keys: set[str] = set()
        self.done: set[str] = set()
        self.written = 0
        self.duplicates = 0
        self.near_duplicates = 0
        self.near = NearDuplicates(near_duplicate_threshold) if near_duplicate_threshold else None
        self._repair(self.path)
        self._repair(self.done_path)
        if self.path.exists():
            with open(self.path) as f:
                for line in f:
                    row = json.loads(line)
                    self.keys.add(dedup_key(row))
                    self.done.add(row["id"])
                    if self.near is not None:
                        self.near.add(row)
        if self.done_path.exists():
            self.done |= {line.strip() for line in self.done_path.read_text().splitlines() if line.strip()}
        self._f = open(self.path, "a")  # noqa: SIM115  (held open for the run; closed by close())
        self._d = open(self.done_path, "a")  # noqa: SIM115

    @staticmethod
    def _repair(path: Path) -> None:
        """Cut a torn last line (a kill mid-write) so every line is whole JSON."""
        if not path.exists() or path.stat().st_size == 0:
            return
        data = path.read_bytes()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(keep)

    def add(self, item_id: str, row: dict | None) -> bool:
        """Write `row` (None for a dropped item) and mark `item_id` finished; False if a duplicate, a near-duplicate
        or none."""
        wrote = False
        if row is not None:
            key = dedup_key(row)
            if key in self.keys:
                self.duplicates += 1
            elif self.near is not None and self.near.check(row) is not None:
                self.near_duplicates += 1
            else:
                self.keys.add(key)
                if self.near is not None:
                    self.near.add(row)
                self._f.write(json.dumps(row, default=str) + "\n")
                self._f.flush()
                os.fsync(self._f.fileno())
                self.written += 1
                wrote = True
        self._d.write(item_id + "\n")
        self._d.flush()
        os.fsync(self._d.fileno())
        self.done.add(item_id)
        return wrote

    def close(self) -> None:
        self._f.close()
        self._d.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_rows(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
