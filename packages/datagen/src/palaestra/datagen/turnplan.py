"""A sample's user turns: how many, their targets, and each turn's trace (parallel, dependent or directed).

`plan_turns` fixes the number of turns, the last one's kind (normal, miss_func, miss_param) and the first
turns' targets: the item's target, or, as a dependent pair, a tool that feeds it first and the target a turn
later. `turn_trace` then builds each turn's trace on the evolving state: parallel calls (`parallel`), a
target that takes an earlier turn's result (`carry`), or a target drawn by `weighted_tool`, each through
the directed sampler.
"""

from __future__ import annotations

import random
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from palaestra.datagen.carry import CARRY_TRIES, carry_targets
from palaestra.datagen.graph import ApiGraph
from palaestra.datagen.parallel import sample_parallel
from palaestra.datagen.sampler import draw_length, sample_trace

FED_BONUS = 3.0
"""Later turns' targets: weight of a tool that another tool's output can feed, relative to one none can."""
DEPENDENT_BONUS = 5.0
"""Later turns' targets: weight, on top, of a tool that a tool called in an earlier turn can feed."""


def weighted_tool(
    graph: ApiGraph,
    env: str,
    rng: random.Random,
    exclude: AbstractSet[str] = frozenset(),
    after: AbstractSet[str] = frozenset(),
    producers: bool = False,
) -> str:
    """A tool by node weight; one that an output-to-input mapping can feed weighs `FED_BONUS` times more (a goal
    whose steps feed each other), and one that a tool in `after` (called in an earlier turn) can feed
    `DEPENDENT_BONUS` times more again (a turn that can take an earlier turn's result: FunReason-MT's dependent
    turns). `producers`: a tool whose output can feed another weighs `FED_BONUS` times more too (a turn a
    later one can depend on)."""
    tools = [t for t in graph.tools(env) if t not in exclude]
    sources = {t: graph.feeders(env, t) for t in tools}
    feeding = {f for t in graph.tools(env) for f in graph.feeders(env, t)} if producers else set()
    weights = [
        graph.weight(env, t)
        * (FED_BONUS if sources[t] else 1.0)
        * (DEPENDENT_BONUS if sources[t] & after else 1.0)
        * (FED_BONUS if t in feeding else 1.0)
        for t in tools
    ]
    return rng.choices(tools, weights=weights)[0]


@dataclass
class TurnPlan:
    """An item's user turns: each turn's target tool (None: drawn after the earlier turns, `weighted_tool` with
    their calls), the last turn's kind, the function a miss_func turn withholds."""

    targets: list[str | None]
    last_kind: str
    withheld: str | None


def plan_turns(item: dict, graph: ApiGraph, env_name: str, cfg: Any, rng: random.Random) -> TurnPlan:
    """How many turns, what kind the last one is (normal, miss_func, miss_param), the first turn's target and
    the function a miss_func turn withholds (its target; the other turns' targets are drawn as they come)."""
    n_turns = rng.randint(cfg.min_turns, cfg.max_turns)
    last_kind = "normal"
    roll = rng.random()
    if roll < cfg.p_miss_func:
        last_kind = "miss_func"
    elif roll < cfg.p_miss_func + cfg.p_miss_param:
        last_kind = "miss_param"
    targets: list[str | None] = [item["target"]] + [None] * (n_turns - 1)
    if last_kind == "miss_func" and n_turns > 1:
        targets[-1] = weighted_tool(graph, env_name, rng)
        if targets[-1] == targets[0]:
            last_kind = "normal"  # the withheld function must not be needed before its turn
    feeders = sorted(graph.feeders(env_name, item["target"]) - {targets[-1]}) if n_turns > 1 else []
    if feeders and not (last_kind == "miss_func" and n_turns == 2) and rng.random() < cfg.p_carry:
        # a dependent pair: a producer of the target first, the target a turn later takes its result
        targets[0], targets[1] = (
            rng.choices(feeders, weights=[graph.weight(env_name, f) for f in feeders])[0],
            targets[0],
        )
    return TurnPlan(targets, last_kind, targets[-1] if last_kind == "miss_func" else None)


def turn_trace(env, graph: ApiGraph, spec, target: str | None, t: int, kind: str, fixed: bool, rng, stats,
               exclude: set[str], seen_outputs: list, seen_arguments: list, called: set[str], p: Any,
               last: bool, seen_raw: list):  # fmt: skip
    """One turn's trace: in a later turn, preferably one whose target takes an earlier turn's result (`carry`,
    `p.p_carry`); else parallel calls (`p.p_parallel`, a normal turn whose target is not fixed by the plan);
    else directed toward the target (drawn by `weighted_tool` where the plan left it open)."""
    if t > 0 and (target is None or fixed) and rng.random() < p.p_carry:
        pool = carry_targets(spec, seen_outputs, seen_arguments, exclude, seen_raw)
        pool = [x for x in pool if target in (None, x[0])]
        for _ in range(CARRY_TRIES):  # a carried value can fail in its call: try another
            if not pool:
                break
            pick = rng.choices(pool, weights=[graph.weight(spec.name, x[0]) for x in pool])[0]
            pool.remove(pick)
            length = max(draw_length(rng), len(graph.prerequisites(spec.name, pick[0])) + 1)  # room to get there
            made = sample_trace(env, graph, pick[0], rng, length, stats, exclude, seen_outputs,
                                seen_arguments, {pick[1]: pick[2]}, seen_raw)  # fmt: skip
            if any(s.prior_feeds for s in made[0].steps):
                return made
    if kind == "normal" and not (fixed and t > 0) and rng.random() < p.p_parallel:
        parallel = sample_parallel(env, graph, rng, stats, exclude, seen_outputs, seen_arguments, target)
        if parallel is not None:
            return parallel
    if target is None:
        target = weighted_tool(graph, spec.name, rng, exclude, called, producers=not last)
    return sample_trace(
        env, graph, target, rng, draw_length(rng), stats, exclude, seen_outputs, seen_arguments, None, seen_raw
    )
