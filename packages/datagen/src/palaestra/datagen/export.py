"""The ``datagen.export`` job: samples -> OpenAI messages with a ``tools`` list (TRL) and ShareGPT, plus a dataset card.

Reads ``<output_dir>/datagen/<name>/samples.jsonl`` (or ``input``) and writes next to it, in ``export/``:

- ``openai.jsonl``: ``{"id", "env", "messages", "tools"}`` per sample; ``tools`` a list of OpenAI tool
  schemas, ``messages`` OpenAI chat messages whose tool calls carry ``arguments`` as a JSON string, as OpenAI's
  API does. An object would not survive ``datasets``: arrow's JSON reader turns ``0.924602`` into
  ``0.9246019999999999``, a call that was never executed. The string is the executed call's own JSON, so
  ``json.loads`` gives back exactly what ran. Chat templates that take both forms (Qwen2.5/3's, the
  project's) print it as is. Assistant text keeps its ``<think>...</think>``. The message that adds a
  withheld function (miss_func) has role ``added_function_role``: ``system`` (default; it carries the
  function's schema) or ``user``, for chat templates that refuse a system message after the first turn.
- ``sharegpt.jsonl``: ``{"id", "conversations", "tools"}`` in LLaMA-Factory's function-calling form:
  ``human`` / ``gpt`` / ``function_call`` (JSON ``{"name", "arguments"}``, a list for parallel calls) /
  ``observation`` turns, alternating; ``tools`` a JSON string. A ``function_call`` turn cannot hold text, so
  the reasoning before a call is kept only in ``openai.jsonl``; the function added mid-conversation becomes a
  ``human`` turn.
- ``sft_turns.jsonl``: one row per assistant message, ``{"id", "env", "turn", "prompt", "completion",
  "tools"}`` (`sft_turn_records`): the message as the completion, its own history as the prompt, earlier
  turns' reasoning dropped as Qwen3's template drops it; for TRL's ``SFTTrainer`` with
  ``completion_only_loss`` (a whole conversation under Qwen3's template loses the reasoning of every turn but
  the last, and its template has no generation markers for ``assistant_only_loss``).
- ``README.md``: the dataset card (schema, counts, environments, statistics, what the data teaches,
  how it was made, provenance, contamination).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from palaestra.datagen.dataset import read_rows
from palaestra.shared.config import ConfigError, JobConfig
from palaestra.shared.jobs import job
from palaestra.shared.tracking import Tracker


class ExportFormat(StrEnum):
    openai = "openai"
    sharegpt = "sharegpt"
    sft_turns = "sft_turns"


class AddedFunctionRole(StrEnum):
    system = "system"
    user = "user"


@dataclass
class ExportConfig(JobConfig):
    """Export a generated dataset for training."""

    job: str = "datagen.export"
    name: str = "default"
    """The dataset: ``<output_dir>/datagen/<name>/samples.jsonl``."""
    input: str | None = None
    """Or an explicit samples file."""
    formats: list[ExportFormat] = field(default_factory=lambda: list(ExportFormat))
    """openai | sharegpt | sft_turns."""
    added_function_role: AddedFunctionRole = AddedFunctionRole.system
    """Role of the message that adds a withheld function: system | user."""

    @property
    def input_path(self) -> Path:
        return Path(self.input) if self.input else Path(self.output_dir) / "datagen" / self.name / "samples.jsonl"


def _arguments_json(arguments: str | dict) -> str:
    """A call's arguments as the JSON string that was executed (a dict is dumped; a string is kept as is)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def openai_record(row: dict, added_function_role: str = "system") -> dict:
    """One sample as ``{"id", "env", "messages", "tools"}`` (see the module docstring)."""
    messages: list[dict] = []
    for m in row["messages"]:
        out = {"role": m["role"], "content": m["content"] or ""}
        if m["role"] == "system" and messages:
            out["role"] = added_function_role
        if m.get("tool_calls"):
            out["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": _arguments_json(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            out["tool_call_id"] = m["tool_call_id"]
            out["name"] = m["name"]
        messages.append(out)
    tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
    return {"id": row["id"], "env": row["provenance"]["env"], "messages": messages, "tools": tools}


def _without_thinking(message: dict) -> dict:
    content = message.get("content") or ""
    if message["role"] == "assistant" and "</think>" in content:
        content = content.split("</think>", 1)[1].lstrip("\n")
    return {**message, "content": content}


def sft_turn_records(row: dict, added_function_role: str = "system") -> list[dict]:
    """One ``{"id", "env", "turn", "prompt", "completion", "tools"}`` per assistant message of a sample.

    ``completion`` is that assistant message (its ``<think>`` kept), ``prompt`` every message before it, as a
    Qwen3-style template shows them at inference: the reasoning of assistant messages before the last user
    message is dropped, that of the current user turn's earlier steps kept. So every reasoning block is trained
    once, in the context the model sees when it writes it (FunReason-MT trains each turn with its own history);
    TRL's ``SFTTrainer`` takes the prompt-completion form with ``completion_only_loss`` and needs no generation
    markers in the template.
    """
    rec = openai_record(row, added_function_role)
    messages = rec["messages"]
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        last_user = max((j for j in range(i) if messages[j]["role"] == "user"), default=-1)
        prompt = [_without_thinking(x) if j < last_user else x for j, x in enumerate(messages[:i])]
        turn = sum(1 for x in messages[:i] if x["role"] == "user")
        out.append(
            {
                "id": f"{row['id']}-m{i}",
                "env": rec["env"],
                "turn": turn,
                "prompt": prompt,
                "completion": [m],
                "tools": rec["tools"],
            }
        )
    return out


def sharegpt_record(row: dict) -> dict:
    """One sample in LLaMA-Factory's ShareGPT function-calling form (see the module docstring)."""
    turns: list[dict] = []

    def add(who: str, value: str) -> None:
        if turns and turns[-1]["from"] == who and who in ("observation", "human"):
            turns[-1]["value"] += "\n" + value  # parallel results in one observation turn
        else:
            turns.append({"from": who, "value": value})

    for m in row["messages"]:
        if m["role"] in ("user", "system"):
            add("human", m["content"] or "")
        elif m["role"] == "tool":
            add("observation", m["content"] or "")
        elif m.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                for c in m["tool_calls"]
            ]
            add("function_call", json.dumps(calls[0] if len(calls) == 1 else calls))
        else:
            add("gpt", m["content"] or "")
    tools = row["tools"] if isinstance(row["tools"], str) else json.dumps(row["tools"])
    return {"id": row["id"], "conversations": turns, "tools": tools}


def dataset_card(rows: list[dict], stats: dict, source: Path, files: list[str]) -> str:
    """A dataset card (README.md) for the exported files."""
    envs = Counter(r["provenance"]["env"] for r in rows)
    kinds = Counter(t["kind"] for r in rows for t in r["turns"])
    calls = sum(r["difficulty"]["num_calls"] for r in rows)
    hidden = sum(r["difficulty"]["hidden_steps"] for r in rows)
    roles = Counter(json.dumps(r["provenance"]["roles"], sort_keys=True) for r in rows)
    c = stats.get("contamination", {})
    yaml_files = "\n".join(f"- config_name: {f.split('.')[0]}\n  data_files: {f}" for f in files)
    lines = [
        "---",
        "license: apache-2.0",
        "task_categories: [text-generation]",
        "tags: [function-calling, tool-use, multi-turn, synthetic]",
        f"configs:\n{yaml_files}",
        "---",
        "",
        f"# {source.parent.name}: verified multi-turn tool-use conversations",
        "",
        "Synthesized by `palaestra.datagen` (HardGen + FunReason-MT structure) on executable environments"
        " (BFCL's eight multi-turn API classes, from `bfcl-eval`, Apache-2.0). Every sample was executed and"
        " verified by replay (the conversation's calls reproduce the ground truth's results and final state),"
        " and passed the project's grounding check: each argument of a ground-truth call is said in the request"
        " it answers (once per use), read from an earlier call's output where it is the only candidate or one"
        " singled out by a criterion the user states, or a documented default. That check is a heuristic over"
        " text, not a proof that the request determines the calls.",
        "",
        "## How it was made",
        "",
        *_how_made(roles),
        "",
        "## Files",
        "",
        *[f"- `{f}`" for f in files],
        "",
        "`openai.jsonl`: `id`, `env`, `messages` (OpenAI chat; tool calls with `arguments` a JSON string, as"
        " OpenAI's API has them, so numbers load exactly as they were executed;"
        " assistant text starts with `<think>...</think>`), `tools` (list of OpenAI tool schemas). Load with"
        ' `datasets.load_dataset("json", data_files="openai.jsonl")` and pass it to TRL\'s `SFTTrainer`.'
        " `sharegpt.jsonl`: `id`, `conversations` (human / gpt / function_call / observation), `tools`"
        " (JSON string), LLaMA-Factory's function-calling form; reasoning before calls is only in the OpenAI file."
        " `sft_turns.jsonl`: one row per assistant message (`prompt`: its own history, earlier turns' reasoning"
        " dropped as Qwen3's template drops it; `completion`: the message), for TRL's `SFTTrainer` with"
        " `completion_only_loss=True`.",
        "",
        "## Counts",
        "",
        f"- samples: {len(rows)}; user turns: {sum(kinds.values())}; ground-truth calls: {calls}"
        f" ({calls / max(1, len(rows)):.2f} per sample); hidden (intermediate) steps: {hidden}",
        "- turns by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
        "- environments: " + ", ".join(f"{e} {n}" for e, n in sorted(envs.items())),
        "",
        "## Statistics of the generation run",
        "",
    ]
    keys = ("kept", "dropped", "duplicates", "near_duplicates", "calls_per_trace", "hidden_step_fraction")
    for key in (*keys, "function_coverage", "env_coverage"):
        if key in stats:
            v = stats[key]
            lines.append(f"- {key}: {v:.3f}" if isinstance(v, float) else f"- {key}: {v}")
    if stats.get("drops"):
        lines.append("- drops by reason: " + ", ".join(f"{k} {n}" for k, n in stats["drops"].items()))
    lines += [
        f"- ungrounded kept samples: {stats.get('ungrounded_kept', 'n/a')};"
        f" error responses among ground-truth steps: {stats.get('error_response_steps', 'n/a')}",
        "",
        *_teaches(stats.get("quality") or {}),
        "## Provenance",
        "",
        f"- source: the run `{source.parent.name}` (`{source.name}`); each row's `id` names the run, seed, round"
        " and item",
        "- initial states: drawn per sample by `palaestra.datagen.initial_states` (never a BFCL test config)",
        "- roles (tool maker, query writer, reasoner, critic): "
        + "; ".join(f"{json.loads(k)} x{n}" for k, n in roles.items()),
        "",
        "## Contamination check (BFCL test entries)",
        "",
        f"- checked {c.get('checked', 'n/a')} samples: {c.get('contaminated', 'n/a')} contaminated"
        f" ({c.get('config_identical', 'n/a')} with an initial config identical to a BFCL multi-turn test config,"
        f" {c.get('query_ngram_overlap', 'n/a')} sharing a {c.get('ngram', 8)}-word n-gram with a BFCL test query)",
        "",
    ]
    return "\n".join(lines)


def _how_made(roles: Counter) -> list[str]:
    used = {k: v for key in roles for k, v in json.loads(key).items()}
    lines = []
    if used.get("query_writer") == "deterministic":
        lines.append(
            "- requests: written from templates (openers, connectives, the tools' own descriptions turned into"
            " instructions, the values), not by a language model: their wording is limited to those templates"
        )
    else:
        lines.append("- requests: written by a language model from the trace's goal, steps and values")
    if used.get("reasoner") == "deterministic":
        lines.append(
            "- assistant turns: an oracle that follows the sampled ground truth (its reasoning is templated and"
            " knows the answer); it sometimes skips a lookup on a first try so that a critic hint is exercised"
        )
    else:
        lines.append("- assistant turns: a language model's, kept only when replay verified them")
    lines.append(
        "- traces: a directed sampler over an API graph toward a target tool; the trace ends at its goal (the"
        " target, or a tool that consumes its result); read-only calls that feed nothing are pruned"
    )
    if "judge" in used:
        lines.append(
            "- filter: a language model judged whether each verified sample's requests determine its calls;"
            " samples under the threshold were dropped (`verdict.judge_score`)"
        )
    return lines


def _teaches(q: dict) -> list[str]:
    if not q:
        return []
    keys = (
        "query_frames",
        "ungrammatical_queries",
        "flow_share",
        "leaked_values",
        "borrowed_values",
        "think_skeletons",
        "closing_reply_frames",
        "closing_replies_reporting_results",
        "closing_replies_naming_tools",
    )
    out = ["## What the data teaches (`stats.json` -> `quality`; definitions in `palaestra.datagen.quality`)", ""]
    for key in keys:
        if key in q:
            v = q[key]
            out.append(f"- {key}: {v:.3f}" if isinstance(v, float) else f"- {key}: {v}")
    return [*out, ""]


@job("datagen.export", ExportConfig)
def export(cfg: ExportConfig, tracker: Tracker) -> dict:
    """Export samples to OpenAI messages + tools (TRL) and ShareGPT, with a dataset card."""
    source = cfg.input_path
    if not source.is_file():
        raise ConfigError(f"datagen.export: no samples file at {source} (run datagen.generate first)")
    rows = read_rows(source)
    stats_path = source.parent / "stats.json"
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
    else:
        from palaestra.datagen.run_stats import audit_rows

        stats = audit_rows(rows)
    out = source.parent / "export"
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for fmt in cfg.formats:
        name = f"{fmt}.jsonl"
        with open(out / name, "w") as f:
            for row in rows:
                if fmt == "sft_turns":
                    recs = sft_turn_records(row, cfg.added_function_role)
                else:
                    recs = [openai_record(row, cfg.added_function_role) if fmt == "openai" else sharegpt_record(row)]
                f.writelines(json.dumps(rec) + "\n" for rec in recs)
        files.append(name)
    (out / "README.md").write_text(dataset_card(rows, stats, source, files))
    for name in [*files, "README.md"]:
        tracker.log_artifact(out / name, "export")
    print(f"datagen.export: {len(rows)} samples -> {out} ({', '.join(files)}, README.md)")
    return {"samples": len(rows), "output": str(out)}
