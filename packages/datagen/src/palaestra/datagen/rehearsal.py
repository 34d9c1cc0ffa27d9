"""How ``datagen.generate`` rehearses (`palaestra.shared.rehearse`): the same roles and environments, a few items.

A served-LLM config (``roles.llm.backend: openai``) is pointed at the rehearsal's local OpenAI-compatible server
(``palaestra serve`` over the small Qwen3-architecture model); its Ray workers stay (two). The check reads the
samples file back: every line one JSON sample with messages and tools, as many as the summary says it kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from palaestra.shared.rehearse import Rehearsal, RehearsalContext

ITEMS = 4
"""Work items of a rehearsal (a few per environment in the mix is enough to cross every role)."""


def scale(data: dict[str, Any], ctx: RehearsalContext) -> dict[str, Any]:
    roles = data.get("roles", {})
    out: dict[str, Any] = {
        "num_samples": ITEMS,
        "workers": min(int(data.get("workers", 2)), 2),
        "items_per_task": 2,
        "item.k_max": 2,
        "item.max_steps": 3,
        "item.max_turns": 2,
    }
    llm = roles.get("llm", {})
    if llm.get("backend") == "openai":
        out.update({"roles.llm.base_url": ctx.base_url, "roles.llm.model": ctx.model})
    elif "roles" in data:
        out.update({"roles.llm.model": ctx.model, "roles.llm.device": "cpu"})
    if "roles" in data:
        out["roles.sampling.max_tokens"] = 48
    return out


def served_llm(data: dict[str, Any]) -> bool:
    return data.get("roles", {}).get("llm", {}).get("backend") == "openai"


def check(cfg: Any, summary: dict[str, Any]) -> str:
    path = Path(cfg.output_path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if len(rows) != summary["kept"]:
        raise AssertionError(f"{path}: {len(rows)} samples, the job kept {summary['kept']}")
    for row in rows:
        if not isinstance(row.get("messages"), list) or "tools" not in row:
            raise AssertionError(f"{path}: a sample without messages and tools: {sorted(row)}")
    return f"{len(rows)} samples reread from {path.name} ({summary['dropped']} dropped by verification)"


GENERATE = Rehearsal(scale=scale, check=check, served_llm=served_llm)
