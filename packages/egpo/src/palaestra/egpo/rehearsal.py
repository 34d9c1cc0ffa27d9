"""How ``egpo.train`` rehearses (`palaestra.shared.rehearse`): the paper config's path at a few tasks and steps.

Scaled: the model (the rehearsal's Qwen3-architecture model), the learner's ranks (2, gloo, on CPU; strategy,
gradient checkpointing and micro-batch budget kept), one rollout worker on CPU (vLLM where importable, else
the transformers backend; the weight sync kept), group size, turns, lengths, one epoch over a few tasks, the
minibatch, a checkpoint every step, BFCL's evaluation at one entry per category (every category kept).

Stubbed (they need the network): the four hub sources of ``public_fc_tasks`` become local files written here
in each release's own layout (``xlam``, ``apigen_mt``, ``funreason_mt``, ``hardgen``), so the same loaders and
BFCL's contamination check read them. Datagen's multi-turn rows (a file the datagen stage writes) are made by
``datagen.generate`` itself (deterministic roles, a few items), looked up by job name: no import of datagen.

The check (`reload_train_checkpoint`) reloads the last checkpoint into a fresh model (manifest verified).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from palaestra.shared.rehearse import Rehearsal, RehearsalContext, reload_train_checkpoint

_WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {
        "city": {"description": "City name.", "type": "str"},
        "units": {"description": "metric or imperial.", "type": "str, optional", "default": "metric"},
    },
}
_ORDER = {
    "name": "cancel_order",
    "description": "Cancel a pending order.",
    "parameters": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
        "required": ["order_id", "reason"],
    },
}
_FILES = "[{'name': 'cd', 'description': 'Change directory.', 'parameters': {'type': 'dict', 'properties': {'folder': {'type': 'string', 'description': 'Folder.'}}, 'required': ['folder']}}]"  # noqa: E501


def write_public_sources(root: Path) -> dict[str, str]:
    """Two records per public source in its release's layout (see `palaestra.egpo.public_data`); name -> path."""
    root.mkdir(parents=True, exist_ok=True)
    xlam = [
        {
            "id": i,
            "query": f"What is the weather in {city}?",
            "tools": json.dumps([_WEATHER]),
            "answers": json.dumps([{"name": "get_weather", "arguments": {"city": city}}]),
        }
        for i, city in enumerate(["Lyon", "Oslo"])
    ]
    apigen = [
        {
            "system": "Cancel orders only for the user's own orders.",
            "tools": json.dumps([_ORDER]),
            "conversations": [
                {"from": "human", "value": f"Please cancel order {order}, I ordered it by mistake."},
                {
                    "from": "function_call",
                    "value": json.dumps(
                        {"name": "cancel_order", "arguments": {"order_id": order, "reason": "ordered by mistake"}}
                    ),
                },
                {"from": "observation", "value": '{"status": "cancelled"}'},
                {"from": "gpt", "value": "It is cancelled."},
            ],
        }
        for order in ["#W1", "#W2"]
    ]

    def funreason(folder: str) -> dict:
        return {
            "0": {"role": "system", "content": "You are an expert in composing functions.", "tools": _FILES},
            "1": {"role": "user", "content": f"Go into the {folder} folder."},
            "2": {"role": "assistant", "content": f"<think>cd there.</think>[cd(folder='{folder}')]"},
            "3": {"role": "tool", "content": f"[{{\"cd(folder='{folder}')\": 'ok'}}]"},
            "4": {"role": "assistant", "content": "Done."},
            "error_tool_response": False,
        }

    files = {
        "xlam": ("xlam.json", json.dumps(xlam)),
        "apigen_mt": ("apigen_mt.json", json.dumps(apigen)),
        "funreason_mt": ("bfcl_multi_turn.json", json.dumps([funreason("reports"), funreason("drafts")])),
        "hardgen": ("hardgen.jsonl", "\n".join(json.dumps(funreason(f)) for f in ["logs", "notes"]) + "\n"),
    }
    out = {}
    for name, (filename, text) in files.items():
        (root / filename).write_text(text)
        out[name] = str(root / filename)
    return out


def datagen_rows(root: Path, items: int = 4) -> str:
    """Datagen's multi-turn samples, made by ``datagen.generate`` (deterministic roles) without MLflow."""
    from palaestra.shared.jobs import load_config, run_job

    path = root / "datagen" / "rehearsal" / "samples.jsonl"
    if not path.exists():
        cfg = load_config(
            {
                "job": "datagen.generate",
                "name": "rehearsal",
                "output_dir": str(root),
                "num_samples": items,
                "workers": 0,
                "envs": ["GorillaFileSystem", "MathAPI"],
                "item": {"min_turns": 2, "max_turns": 2},
                "tracking": {"enabled": False},
            }
        )
        run_job(cfg)
    return str(path)


def scale(data: dict[str, Any], ctx: RehearsalContext) -> dict[str, Any]:
    out: dict[str, Any] = {
        **ctx.trainer_placement(),
        "rollout.group_size": 2,
        "rollout.max_turns": 3,
        "rollout.max_tokens_per_turn": 24,
        "rollout.max_context_tokens": 4096,
        "tasks_per_step": 6,
        "minibatch_size": 6,
        "checkpoint_every": 1,
        "eval.limit": 1,
        "eval.max_tokens_per_turn": 24,
        "eval.max_model_calls": 2,
    }
    if data.get("task_sampling") == "epochs":
        out["epochs"] = 1
    else:
        out["steps"] = 2
    data_dir = ctx.workdir / "data"
    for i, env in enumerate(data.get("envs", [])):
        kwargs = env.get("kwargs", {})
        sources = kwargs.get("source_kwargs", {}).get("sources")
        if sources:
            local = write_public_sources(data_dir / "public")
            out[f"envs.{i}.kwargs.source_kwargs.sources"] = [
                {**s, "path": local[s.get("format", s.get("name"))], "limit": 2}
                for s in sources
                if str(s.get("path", "")).startswith("hf://")
            ] + [s for s in sources if not str(s.get("path", "")).startswith("hf://")]
        if env.get("name") == "datagen_multi_turn":
            out[f"envs.{i}.kwargs.path"] = datagen_rows(data_dir)
            out[f"envs.{i}.kwargs.limit"] = 2
    return out


TRAIN = Rehearsal(scale=scale, check=reload_train_checkpoint)
