"""Parallel calls within one turn (BFCL's parallel and parallel_multiple categories).

A parallel turn asks for several independent goals at once: the same function
with different arguments ("check AAPL and NVDA") or different functions ("make
a folder and tell me the time"). The assistant makes all calls in one message.
`sample_parallel` builds such a trace on the live environment: 2-4 calls of
tools that are legal now (no prerequisite), every call succeeds, no value is
one only a tool output gives (`sampler._leaks`), a value may come from an
earlier turn's result (`prior_feeds`, kind-checked), and the calls are
*independent*: each alone, from the turn's start, returns what it returns in
the batch, and the batch in reverse order leaves the same state
(`independent`, which `coherence.check_row` re-checks on the emitted row).
No call feeds another, so every call is a stated goal.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from palaestra.datagen.argfill import leaves
from palaestra.datagen.coherence import step_breaks_coherence
from palaestra.datagen.envs import ToolEnv
from palaestra.datagen.graph import ApiGraph, try_call
from palaestra.datagen.sampler import SamplerStats, Trace, TraceStep, _echo, _leaks, _producer
from palaestra.datagen.schema import parameters

P_SAME_FUNCTION = 0.5
"""Chance that a parallel turn calls one function with different arguments (BFCL parallel), else several
different functions (parallel_multiple)."""
WIDTHS = {2: 0.6, 3: 0.3, 4: 0.1}
"""Calls per parallel turn."""


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)


def independent(start: ToolEnv, calls: Sequence[tuple[str, dict]]) -> bool:
    """Whether the calls are independent: each alone from `start` returns what it returns in order, and the
    reverse order gives the same results and the same final state."""
    forward = start.copy()
    outs = [_canon(forward.execute(n, a).output) for n, a in calls]
    for (n, a), out in zip(calls, outs):
        if _canon(start.copy().execute(n, a).output) != out:
            return False
    backward = start.copy()
    back = [_canon(backward.execute(n, a).output) for n, a in reversed(calls)]
    return back[::-1] == outs and backward.same_state(forward)


def sample_parallel(
    env: ToolEnv,
    graph: ApiGraph,
    rng: random.Random,
    stats: SamplerStats | None = None,
    exclude: AbstractSet[str] = frozenset(),
    prior_outputs: Sequence[tuple[str, Any]] = (),
    prior_arguments: Sequence[dict] = (),
    want: str | None = None,
) -> tuple[Trace, ToolEnv] | None:
    """A parallel trace (2-4 independent calls, `Trace.parallel`) and the environment after it, or None when
    this state offers no such set. `want`: a tool to call first where it is legal (the turn's target)."""
    name = env.spec.name
    start = env
    legal = [t for t in env.spec.tool_names if t not in exclude and not graph.prerequisites(name, t)]
    if not legal:
        return None
    width = rng.choices(list(WIDTHS), weights=list(WIDTHS.values()))[0]
    same = rng.random() < P_SAME_FUNCTION
    pool = list(legal)
    known = json.dumps(env.scenario, default=str) + json.dumps(list(prior_arguments), default=str)
    said_before = TraceStep("", {f"{i}.{k}": v for i, a in enumerate(prior_arguments) for k, v in a.items()}, None)
    outputs = list(prior_outputs)
    steps: list[TraceStep] = []
    first = want if want in pool else None
    tool = (first or rng.choices(pool, weights=[graph.weight(name, t) for t in pool])[0]) if same else None
    for _ in range(width * 4):
        if len(steps) >= width or not pool:
            break
        pick = tool or first or rng.choices(pool, weights=[graph.weight(name, t) for t in pool])[0]
        first = None
        new_env, ex = try_call(env, pick, outputs, rng)
        if stats is not None and ex is not None:
            stats.record(name, pick, ex.ok)
        same_result = any(s.name == pick and _canon(s.output) == _canon(ex.output) for s in steps) if ex else False
        if ex is None or not ex.ok or same_result:  # the same answer twice is one goal, not two
            if not same:
                pool.remove(pick)
            continue
        step = TraceStep(pick, ex.arguments, ex.output)
        props = parameters(env.spec.doc(pick))
        fed_here = False
        for param, value in ex.arguments.items():
            found = _producer(value, outputs, param, props.get(param, {}))
            if found is None:
                continue
            if found >= len(prior_outputs):
                fed_here = True  # another call of this turn produced it: not independent
            elif not any(_echo(value, x) for x in [*steps, said_before]):
                step.prior_feeds[param] = outputs[found][0]
        if (
            fed_here
            or step_breaks_coherence(step, [], env.spec.doc(pick))
            or _leaks(step, outputs, known + json.dumps([x.arguments for x in steps], default=str), props)
            or not independent(start, [(s.name, s.arguments) for s in steps] + [(pick, ex.arguments)])
        ):
            if not same:
                pool.remove(pick)
            continue
        step.changes_state = not env.same_state(new_env)
        env = new_env
        steps.append(step)
        outputs += leaves(ex.output, "result")
        if not same:
            pool.remove(pick)
    if len(steps) < 2:
        return None
    return Trace(name, steps[-1].name, steps, True, parallel=True), env
