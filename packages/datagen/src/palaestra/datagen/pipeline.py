"""One work item -> one verified sample (or a counted drop): the per-sample pipeline.

For each user turn: directed trace toward the turn's target (`sampler`), the
advanced tool (tool maker), the hard query (query writer), the guided
iterative chain (reasoner + verification + critic, `chain`). Multi-turn
samples continue on the evolving state; a ``miss_param`` turn withholds one
input (the right answer asks for it; the next user turn gives it) and a
``miss_func`` turn withholds the target function (the right answer says it
cannot be done; in the next turn the function is added), as BFCL's
miss_param / miss_func categories do. The output row is described in
`palaestra.datagen.dataset`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any

from palaestra.datagen import phrasing as P
from palaestra.datagen import roles as R
from palaestra.datagen.argfill import leaves
from palaestra.datagen.chain import TurnTask, guided_chain
from palaestra.datagen.envs import ToolEnv, get_env
from palaestra.datagen.graph import ApiGraph
from palaestra.datagen.role_registry import STAGES, RoleContext, build, choice, role_names
from palaestra.datagen.sampler import SamplerStats
from palaestra.datagen.schema import parameters
from palaestra.datagen.turnplan import plan_turns, turn_trace
from palaestra.shared.config import value_check
from palaestra.shared.llm.base import LLMConfig, SamplingParams

ANSWERS = ["The {w} is {v}.", "It's {v}.", "Use {v}.", "Sorry, I forgot: the {w} is {v}.", "{v}, please."]
"""The user's answer when the assistant asked for a missing value (a miss_param turn)."""


class RoleImpl(StrEnum):
    """Who plays a built-in stage: templates from schemas and the trace, or an LLM."""

    deterministic = "deterministic"
    llm = "llm"


class JudgeImpl(StrEnum):
    """The judge filter: off, or an LLM (`judge`)."""

    off = "off"
    llm = "llm"


@dataclass
class RolesConfig:
    """Which implementation plays each role, and the LLM behind the LLM ones."""

    tool_maker: RoleImpl = RoleImpl.deterministic
    """deterministic | llm (another registered implementation: under ``others``)."""
    query_writer: RoleImpl = RoleImpl.deterministic
    """deterministic | llm."""
    reasoner: RoleImpl = RoleImpl.deterministic
    """deterministic | llm."""
    critic: RoleImpl = RoleImpl.deterministic
    """deterministic | llm."""
    judge: JudgeImpl = JudgeImpl.off
    """off | llm: an LLM scores every verified sample (does the request determine its calls?), `judge`."""
    judge_threshold: float = 7.0
    """Judge scores (1-10) under this drop the sample as ``judge:low_score``."""
    others: dict[str, str] = field(
        default_factory=dict, metadata=value_check("palaestra.datagen.role_registry:check_choices")
    )
    """Role -> implementation, over the fields above: roles registered beyond the built-in ones
    (`role_registry.register_role`), or another implementation of a built-in one (`add_implementation`)."""
    naive_first_try: float = 0.3
    """Deterministic reasoner: chance to skip hidden steps on its first try (exercises the critic loop)."""
    llm: LLMConfig = field(default_factory=LLMConfig)
    """The model behind the LLM roles."""
    models: dict[str, LLMConfig] = field(
        default_factory=dict, metadata=value_check("palaestra.datagen.pipeline:check_role_models")
    )
    """A model per role where it differs from ``llm`` (``{reasoner: {...}}``: a strong reasoner, a cheap writer;
    ``judge`` too)."""
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.7, max_tokens=256))
    """Sampling for the LLM roles."""
    max_consecutive_errors: int = 5
    """Stop the run (one line naming the cause) after this many failed LLM requests in a row, per worker
    (0: never; failed requests still count in ``stats.json`` -> ``llm_errors``)."""


@dataclass
class ItemConfig:
    """How one sample is built."""

    k_max: int = 3
    """Tries of the guided chain (HardGen: 3)."""
    max_steps: int = 12
    """Assistant turns per try."""
    min_turns: int = 1
    """User turns per sample, at least."""
    max_turns: int = 3
    """User turns per sample, at most."""
    p_miss_param: float = 0.15
    """Chance that a sample's last turn withholds a parameter."""
    p_miss_func: float = 0.15
    """Chance that a sample's last turn withholds the target function."""
    p_parallel: float = 0.3
    """Chance that a normal turn asks for several independent calls at once (one assistant message; BFCL's
    parallel and parallel_multiple categories, `parallel`)."""
    p_error_recovery: float = 0.0
    """Chance that a sequential normal turn is a flagged error-recovery trajectory (`recovery`: a failing call
    first, the error read, then the right calls; the turn says ``error_recovery``). Off by default."""
    p_carry: float = 0.9
    """Chance that a later turn's target is one that can take an earlier turn's result (`carry`), where any can."""


@cache
def _client(llm_json: str):
    from palaestra.shared.llm import make_client

    return make_client(LLMConfig(**json.loads(llm_json)))


def check_role_models(value: dict, owner) -> str | None:
    unknown = [k for k in value if k not in role_names()]
    return f"unknown role(s) {unknown} (roles: {', '.join(role_names())})" if unknown else None


def make_roles(cfg: RolesConfig, counter=None) -> tuple[R.Roles, Any]:
    """Roles per config through `role_registry`, and the `CountingClient` when any role is an LLM one
    (`counter`, if given: a fork of a worker's, for one of the items it generates at once)."""
    if counter is None and any(choice(cfg, r) == "llm" for r in role_names()):
        from dataclasses import asdict

        from palaestra.datagen.llm_roles import CountingClient

        per_role = {r: _client(json.dumps(asdict(m), sort_keys=True)) for r, m in (cfg.models or {}).items()}
        counter = CountingClient(
            _client(json.dumps(asdict(cfg.llm), sort_keys=True)), cfg.sampling, cfg.max_consecutive_errors, per_role
        )
    ctx = RoleContext(cfg, counter)
    stages = {r: build(r, ctx) for r in STAGES}
    filters = [f for f in (build(r, ctx) for r in role_names("filter")) if f is not None]
    return R.Roles(**stages, filters=filters), counter


class UsageMark:
    """The LLM counter's state when an item starts, so its outcome reports only what the item used."""

    def __init__(self, counter=None) -> None:
        self.counter = counter
        self.calls = counter.calls if counter else 0
        self.causes = dict(counter.error_causes) if counter else {}
        self.usage = {r: dict(u) for r, u in counter.by_role.items()} if counter else {}

    def since(self) -> dict:
        c = self.counter
        return {
            "llm_calls": (c.calls - self.calls) if c else 0,
            "llm_usage": {
                r: {k: v - self.usage.get(r, {}).get(k, 0) for k, v in u.items()}
                for r, u in (c.by_role if c else {}).items()
            },
            "llm_errors": {
                cause: n - self.causes.get(cause, 0)
                for cause, n in (c.error_causes if c else {}).items()
                if n > self.causes.get(cause, 0)
            },
        }


def omitted_input(tool, history: list[dict], rng: random.Random) -> list[str]:
    """A miss_param turn's withheld input: one string value of the advanced tool (3+ characters) the user has not
    said yet; empty when there is none (the turn becomes a normal one)."""
    said = " ".join(m["content"] or "" for m in history)
    strings = [
        k
        for k, v in tool.inputs.items()
        if isinstance(v["value"], str) and len(v["value"]) >= 3 and v["value"].lower() not in said.lower()
    ]
    return [rng.choice(strings)] if strings else []


def turn_tasks(kind: str, query: str, trace, tool, spec, omit: list[str], withheld: str | None, tools_now, all_tools,
               exclude: set[str], rng: random.Random) -> list[TurnTask]:  # fmt: skip
    """The chain's tasks for one user turn: one, or two for miss_param (ask, then the user's answer) and miss_func
    (refuse, then the function is added)."""
    if kind == "miss_param":
        value = tool.inputs[omit[0]]["value"]
        param = tool.inputs[omit[0]]["param"]
        pspec = parameters(spec.doc(trace.steps[tool.inputs[omit[0]]["step"]].name)).get(param, {})
        answer = rng.choice(ANSWERS).format(w=P.param_phrase(param, pspec), v=P.value_text(value))
        return [
            TurnTask(query, trace, tools_now(exclude), "miss_param", param),
            TurnTask(answer, trace, tools_now(exclude), "param_given", param),
        ]
    if kind == "miss_func":
        what = P.imperative(spec.doc(withheld))
        return [
            TurnTask(query, trace, tools_now({withheld}), "miss_func", what),
            TurnTask("", trace, all_tools, "func_added", withheld, schema=spec.doc(withheld)),
        ]
    return [TurnTask(query, trace, tools_now(exclude))]


def turn_entry(task: TurnTask, trace, tool, omit: list[str], withheld: str | None) -> dict:
    """The row's record of one chain task: its kind, query, ground truth and what was missing."""
    entry = {
        "kind": task.kind,
        "query": task.query if task.kind != "func_added" else "",
        "ground_truth": trace.calls if task.expects_calls else [],
        "hidden_steps": len(trace.hidden) if task.expects_calls else 0,
    }
    if task.kind in ("miss_param", "param_given"):
        entry["missing"] = task.missing
    if task.kind == "param_given":
        entry["missing_value"] = tool.inputs[omit[0]]["value"]
    if task.kind in ("miss_func", "func_added"):
        entry["missing"] = withheld
    if task.mistake is not None:
        entry["error_recovery"] = True
    return entry


def trace_record(trace) -> dict:
    """The row's record of one turn's sampled trace."""
    keys = ("name", "arguments", "output", "feeds", "feed_keys", "prior_feeds", "selectors")
    record = {
        "target": trace.target,
        "target_hit": trace.target_hit,
        "steps": [{k: getattr(s, k) for k in keys} for s in trace.steps],
    }
    return record | ({"parallel": True} if trace.parallel else {})


def generate_item(item: dict, graph: ApiGraph, roles: R.Roles, cfg: ItemConfig, counter=None) -> dict:
    """``{"sample": row | None, "drop": reason | None, "stats": {...}}``; never raises for bad model output.

    Steps: plan the turns (`plan_turns`); per turn, a directed trace (`sample_trace`), the advanced tool (tool
    maker), the withheld input of a miss_param turn (`omitted_input`), the hard query (query writer), the chain's
    tasks (`turn_tasks`) each through the guided chain, their records (`turn_entry`, `trace_record`); then the row
    (`dataset.make_row`), its grounding check, its goal coherence by replay (`coherence`) and the filters
    (`role_registry`: the LLM judge, when on)."""
    rng = random.Random(item["seed"])
    spec = get_env(item["env"])
    env = ToolEnv(spec, spec.initial_state(item["scenario"]))
    sampler_stats = SamplerStats()
    chain_stats: dict = {}
    plan = plan_turns(item, graph, spec.name, cfg, rng)
    withheld = plan.withheld
    mark = UsageMark(counter)
    all_tools = R.openai_tools(spec)
    history: list[dict] = []
    turns: list[dict] = []
    traces: list[dict] = []
    advanced: list[dict] = []
    missed: list[dict] = []
    seen_outputs: list = []  # response entries of earlier turns (candidates; the only one there is carried over)
    seen_raw: list = []  # earlier turns' responses, whole (a record there may be singled out by a criterion)
    seen_arguments: list[dict] = []  # arguments of earlier turns' calls (a value there is the user's)

    def tools_now(hidden: set[str]) -> list[dict]:
        return [x for x in all_tools if x["function"]["name"] not in hidden]

    coherence: dict = {}  # the coherence check's problems, once a sample reaches it

    def out(drop: str | None, sample=None, problems=(), fields=None):
        stats = {"sampler": {"calls": sampler_stats.calls, "flows": sampler_stats.flows}, "chain": chain_stats}
        result = {"sample": sample, "drop": drop, "problems": list(problems), **mark.since(), "stats": stats}
        return {**result, **(fields or {}), **coherence}

    called: set[str] = set()  # tools earlier turns called (a later turn preferably takes one's result)
    for t, target in enumerate(plan.targets):
        last = t == len(plan.targets) - 1
        kind = plan.last_kind if last else "normal"
        exclude = {withheld} if withheld and not last else set()
        if target is None and withheld:
            exclude = exclude | {withheld}
        fixed = target is not None and kind != "miss_func"
        trace, _ = turn_trace(env, graph, spec, target, t, kind, fixed, rng, sampler_stats, exclude,
                              seen_outputs, seen_arguments, called, cfg, last, seen_raw)  # fmt: skip
        seen_outputs += [pair for s in trace.steps for pair in leaves(s.output, "result")]
        seen_raw += [s.output for s in trace.steps]
        # what the user said: a value carried into a call (fed, or from an earlier turn) is no value the user stated
        seen_arguments += [
            {k: v for k, v in s.arguments.items() if k not in s.feeds and k not in s.prior_feeds} for s in trace.steps
        ]
        called |= {s.name for s in trace.steps}
        if not trace.steps:
            return out("empty_trace")
        if kind == "miss_func" and not (trace.target_hit and withheld in {s.name for s in trace.steps}):
            return out("miss_func_target_not_reached")  # refusing would be wrong: the listed tools can do this turn
        tool = roles.tool_maker.make(trace, spec, rng)
        if tool is None:
            return out(f"tool_maker:{getattr(roles.tool_maker, 'last_drop', None) or 'none'}")
        omit = omitted_input(tool, history, rng) if kind == "miss_param" else []
        if kind == "miss_param" and not omit:
            kind = "normal"
        query = roles.query_writer.write(tool, trace, spec, rng, omit)
        if query is None or not query.text.strip():
            return out(f"query_writer:{getattr(roles.query_writer, 'last_drop', None) or 'empty'}")
        tasks = turn_tasks(kind, query.text, trace, tool, spec, omit, withheld, tools_now, all_tools, exclude, rng)
        if cfg.p_error_recovery > 0 and kind == "normal" and rng.random() < cfg.p_error_recovery:
            from palaestra.datagen.recovery import mistake

            tasks[0].mistake = mistake(env, trace, rng)
        for task in tasks:
            result = guided_chain(roles, env, history, task, cfg.k_max, rng, cfg.max_steps, chain_stats)
            if result is None:
                why = chain_stats.get("last_failure", "unknown")
                return out("reasoner:prose" if why == "prose" else f"unverified:{why}")
            history += result.messages
            env = result.truth if result.truth is not None else env
            if task.kind == "func_added":
                missed.append({"turn": len(turns), "functions": [withheld]})
            turns.append(turn_entry(task, trace, tool, omit, withheld))
        traces.append(trace_record(trace))
        advanced.append(tool.schema())
    from palaestra.datagen.coherence import check_row
    from palaestra.datagen.dataset import make_row
    from palaestra.datagen.grounding import verify_row

    listed = tools_now({withheld} if withheld else set())
    row = make_row(
        item, spec, history, listed, turns, missed, traces, advanced, roles.names(), graph.version, chain_stats
    )
    problems = verify_row(row, spec)
    if problems:
        return out(f"grounding_{problems[0]}", problems=problems)
    coherence["coherence"] = check_row(row, spec)  # every step follows from the goal, by replay
    if coherence["coherence"]:
        return out(f"coherence_{coherence['coherence'][0]}")
    fields: dict = {}
    for f in roles.filters:  # the filters (the LLM judge, ...): only a verified sample is worth their requests
        verdict = f.check(row)
        fields |= verdict.fields
        if verdict.drop:
            return out(verdict.drop, fields=fields)
        row["verdict"].update(verdict.fields)
    return out(None, row, fields=fields)
