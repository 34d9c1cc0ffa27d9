"""The load of a ``datagen.generate`` run before it runs: LLM requests and tokens per role (`palaestra plan`).

A probe generates the run's first ``PROBE_ITEMS`` work items (the same items, seeds and initial states the run
draws, on the graph as the run starts, as the run samples them) with the deterministic roles standing
in for the LLM ones, and counts per LLM role what that role would have sent in their place: one request per
tool-maker, query-writer and judge call, one per reasoner step (each assistant message), one per critic hint.
Prompt sizes are the LLM roles' own messages (`llm_roles.tool_maker_messages`, ..., `judge.judge_messages`)
plus, for the reasoner, the tool list the server renders into every prompt; completion sizes are the
stand-ins' answers. The counts are scaled by ``num_samples`` / probe items; tokens are characters /
`CHARS_PER_TOKEN` (chat-template tokens not counted).

What it assumes: a model that answers as the deterministic roles do: the oracle reasoner (one call per
message; first tries that skip lookups at ``roles.naive_first_try``, each then a critic request and another
try), every request kept by the query writer's checks, short answers. A weaker model makes more tries and
drops samples after their requests are spent; a reasoning model's thinking adds completion tokens. After a
run, ``stats.json`` -> ``llm_per_kept_sample_by_role`` has the measured rates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from palaestra.datagen import llm_roles as L
from palaestra.datagen import roles as R
from palaestra.datagen.judge import judge_messages
from palaestra.datagen.phrasing import NOISE
from palaestra.datagen.role_registry import FilterVerdict, choice, role_names

CHARS_PER_TOKEN = 4.0
"""Characters per token of English text and JSON under a BPE vocabulary (a rule of thumb)."""
PROBE_ITEMS = 32
JUDGE_ANSWER = '{"score": 8, "reason": "Every call and argument follows from the requests."}'
"""The judge stand-in's answer (its size counts as the judge's completion)."""


@dataclass
class Tally:
    """Per role: requests, prompt characters (message contents), tool-list characters, completion characters."""

    by_role: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, role: str, messages: list[dict], completion: str, tools: list[dict] | None = None) -> None:
        keys = ("requests", "prompt_chars", "tools_chars", "completion_chars")
        use = self.by_role.setdefault(role, dict.fromkeys(keys, 0))
        use["requests"] += 1
        use["prompt_chars"] += sum(len(m.get("content") or "") for m in messages)
        use["tools_chars"] += len(json.dumps(tools)) if tools else 0
        use["completion_chars"] += len(completion or "")


class _ToolMaker:
    name = "deterministic"

    def __init__(self, tally: Tally):
        self.tally, self.inner = tally, R.DeterministicToolMaker()

    def make(self, trace, spec, rng):
        tool = self.inner.make(trace, spec, rng)
        answer = json.dumps({"name": tool.name, "description": tool.description}) if tool else ""
        self.tally.add("tool_maker", L.tool_maker_messages(trace, tool), answer)
        return tool


class _QueryWriter:
    name = "deterministic"

    def __init__(self, tally: Tally):
        self.tally, self.inner = tally, R.DeterministicQueryWriter()

    def write(self, tool, trace, spec, rng, omit=()):
        query = self.inner.write(tool, trace, spec, rng, omit)
        messages = L.query_writer_messages(tool, trace, spec, NOISE[0], omit)
        self.tally.add("query_writer", messages, query.text if query else "")
        return query


class _Reasoner:
    name = "deterministic"

    def __init__(self, tally: Tally, naive_first_try: float):
        self.tally, self.inner = tally, R.DeterministicReasoner(naive_first_try)

    def act(self, messages, tools, turn, try_index, rng) -> str:
        text = self.inner.act(messages, tools, turn, try_index, rng)
        self.tally.add("reasoner", L.reasoner_messages(messages), text, tools)
        return text


class _Critic:
    name = "deterministic"

    def __init__(self, tally: Tally):
        self.tally, self.inner = tally, R.DeterministicCritic()

    def critique(self, turn, attempt_calls, failure, rng) -> str:
        hint = self.inner.critique(turn, attempt_calls, failure, rng)
        self.tally.add("critic", L.critic_messages(turn, attempt_calls, failure), hint)
        return hint


class _Judge:
    name = "deterministic"
    threshold = 0.0

    def __init__(self, tally: Tally):
        self.tally = tally

    role = "judge"

    def check(self, row: dict) -> FilterVerdict:
        self.tally.add("judge", judge_messages(row), JUDGE_ANSWER)
        return FilterVerdict(None, {"judge_score": 10.0})


def stand_in_roles(cfg, tally: Tally) -> R.Roles:
    """The deterministic roles; those the config gives to an LLM (and the judge, when on) count into `tally`."""
    llm = {r for r in role_names() if choice(cfg, r) == "llm"}
    return R.Roles(
        tool_maker=_ToolMaker(tally) if "tool_maker" in llm else R.DeterministicToolMaker(),
        query_writer=_QueryWriter(tally) if "query_writer" in llm else R.DeterministicQueryWriter(),
        reasoner=(_Reasoner if "reasoner" in llm else lambda _t, p: R.DeterministicReasoner(p))(
            tally, cfg.naive_first_try
        ),
        critic=_Critic(tally) if "critic" in llm else R.DeterministicCritic(),
        filters=[_Judge(tally)] if "judge" in llm else [],
    )


def estimate_load(cfg, probe_items: int = PROBE_ITEMS, graph=None) -> dict:
    """``{"items", "probe_items", "probe_kept", "probe": Tally.by_role, "by_role": {role: {"requests",
    "prompt_tokens", "completion_tokens"}}}``: the probe's counts and their scale-up to ``cfg.num_samples``."""
    from palaestra.datagen.generate import build_graph, plan_items
    from palaestra.datagen.graph import ApiGraph
    from palaestra.datagen.pipeline import generate_item

    if graph is None:
        from pathlib import Path

        graph = (
            ApiGraph.from_dict(json.loads(Path(cfg.graph).read_text()))
            if cfg.graph
            else build_graph(cfg.envs, cfg.seed)
        )
    graph = ApiGraph.from_dict(graph.to_dict())  # the probe samples on its own copy
    items = plan_items(cfg, graph)[: max(0, min(probe_items, cfg.num_samples))]
    tally = Tally()
    roles = stand_in_roles(cfg.roles, tally)
    kept = 0
    for it in items:  # on the graph as the run starts, as the run samples (`generate.run_generation`)
        kept += generate_item(it, graph, roles, cfg.item)["sample"] is not None
    scale = cfg.num_samples / len(items) if items else 0.0
    by_role = {
        role: {
            "requests": u["requests"] * scale,
            "prompt_tokens": (u["prompt_chars"] + u["tools_chars"]) / CHARS_PER_TOKEN * scale,
            "completion_tokens": u["completion_chars"] / CHARS_PER_TOKEN * scale,
        }
        for role, u in tally.by_role.items()
    }
    return {
        "items": cfg.num_samples,
        "probe_items": len(items),
        "probe_kept": kept,
        "probe": tally.by_role,
        "by_role": by_role,
    }


def _n(x: float) -> str:
    return f"{x:,.0f}" if x < 1e6 else f"{x / 1e6:,.1f}M"


def generate_plan(cfg):
    """`palaestra plan` for ``datagen.generate`` (`palaestra.shared.plan.JOB_PLANS`): the expected LLM load."""
    from palaestra.shared.plan import JobPlan
    from palaestra.shared.plan_layout import served_plan_lines

    llm = [r for r in role_names() if choice(cfg.roles, r) == "llm"]
    head = f"datagen.generate: {cfg.num_samples:,} work items over {len(cfg.envs)} environment(s)"
    if not llm:
        return JobPlan(f"{head}\nLLM roles: none (every role deterministic): no LLM requests")
    est = estimate_load(cfg)
    n, kept = est["probe_items"], est["probe_kept"]
    lines = [
        f"{head}; LLM roles: {', '.join(llm)}",
        f"probe: the run's first {n} items with the deterministic roles standing in (an oracle reasoner, "
        f"naive_first_try {cfg.roles.naive_first_try:g}): {kept} of {n} kept",
        f"expected LLM load for {cfg.num_samples:,} items (tokens: characters / {CHARS_PER_TOKEN:g}):",
        f"  {'role':<13} {'requests':>12} {'prompt tokens':>15} {'completion tokens':>18}",
    ]
    total = {"requests": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0}
    for role in llm:
        u = est["by_role"].get(role, dict.fromkeys(total, 0.0))
        lines.append(
            f"  {role:<13} {_n(u['requests']):>12} {_n(u['prompt_tokens']):>15} {_n(u['completion_tokens']):>18}"
        )
        total = {k: total[k] + u[k] for k in total}
    lines.append(
        f"  {'total':<13} {_n(total['requests']):>12} {_n(total['prompt_tokens']):>15} "
        f"{_n(total['completion_tokens']):>18}"
    )
    if kept:
        per = total["requests"] / (kept * cfg.num_samples / n)
        lines.append(f"  {per:.1f} requests per kept sample at the probe's keep rate ({kept / n:.2f})")
    lines.append(
        "assumes a model that answers as the deterministic roles do; a weaker one makes more tries, a reasoning "
        "model's thinking adds completion tokens (stats.json -> llm_per_kept_sample_by_role measures a run)"
    )
    lines += served_plan_lines(cfg.roles.llm)  # the teacher's one-GPU layout
    return JobPlan("\n".join(lines))
