"""Directed trace sampler toward a target tool (HardGen).

legal(T) iff Prerequisite(T) ⊆ T_called. The target T_a is picked as soon
as it is legal (or, with probability `P_PRODUCER_FIRST`, right after a tool
whose output can feed it, chosen by edge weight); before that, the legal
tool nearest T_a in the API graph; after it, a random legal tool, weighted
toward consumers of earlier results and by the weight of the edge from the
previous call (the closed loop raises the weights of edges the student fails
on). Every call is executed on the live
environment (through forks: a call that fails is retried with other
arguments, then the tool is set aside for this step). A trace is
(C1, E1, ..., CM, EM), 1 to 8 calls.

Each step records where its argument values came from; a value equal to an
earlier response value is an observed output-to-input flow, and the earlier
step becomes a *hidden* step (its result is an intermediate value the
query will not state).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from palaestra.datagen.argfill import compatible_key, leaves, superlative, unique_candidates
from palaestra.datagen.envs import ToolEnv, call_string
from palaestra.datagen.graph import ApiGraph, node, try_call
from palaestra.datagen.schema import parameters

P_PRODUCER_FIRST = 0.6
"""Chance to call a tool whose output can feed the target right before it (a hidden step), when there is one."""
LENGTH_WEIGHTS = {1: 0.04, 2: 0.12, 3: 0.24, 4: 0.26, 5: 0.16, 6: 0.1, 7: 0.05, 8: 0.03}
"""Trace length distribution (1-8 calls); with prerequisites and failures the mean lands near 3.5."""


@dataclass
class Step:
    name: str
    arguments: dict
    output: Any
    feeds: dict[str, int] = field(default_factory=dict)
    """Parameter -> index of the earlier step whose response supplied its value."""
    feed_keys: dict[str, str] = field(default_factory=dict)
    """Parameter -> the response key it was read from."""
    selectors: dict[str, list[str]] = field(default_factory=dict)
    """Parameter -> ``[sibling, "highest" | "lowest"]`` when the value is one of several records, singled out by
    a numeric field (the query states that criterion)."""

    @property
    def call(self) -> str:
        return call_string(self.name, self.arguments)


@dataclass
class Trace:
    env: str
    target: str
    steps: list[Step]
    target_hit: bool

    @property
    def hidden(self) -> list[int]:
        """Indices of steps whose results feed later steps (intermediate values)."""
        used = {i for s in self.steps for i in s.feeds.values()}
        return sorted(i for i in used if i < len(self.steps) - 1)

    @property
    def calls(self) -> list[str]:
        return [s.call for s in self.steps]


@dataclass
class SamplerStats:
    calls: dict[str, list[int]] = field(default_factory=dict)
    """node -> [calls, failures]."""
    flows: list[tuple] = field(default_factory=list)

    def record(self, env: str, tool: str, ok: bool) -> None:
        entry = self.calls.setdefault(node(env, tool), [0, 0])
        entry[0] += 1
        entry[1] += 0 if ok else 1

    def merge(self, other: SamplerStats) -> None:
        for k, (c, f) in other.calls.items():
            entry = self.calls.setdefault(k, [0, 0])
            entry[0] += c
            entry[1] += f
        self.flows += other.flows


def _producers(graph: ApiGraph, env: str, target: str, legal: list[str], called: set, steps: list) -> list[str]:
    """Legal tools, not called yet, with an output-to-input mapping edge into `target`."""
    if steps and steps[-1].name in {p for p in legal if graph.g.has_edge(node(env, p), node(env, target))}:
        return []  # one producer right before the target is enough
    return [
        p
        for p in legal
        if p != target
        and p not in called
        and graph.g.has_edge(node(env, p), node(env, target))
        and "mapping" in graph.g.edges[node(env, p), node(env, target)]["kinds"]
    ]


def draw_length(rng: random.Random) -> int:
    return rng.choices(list(LENGTH_WEIGHTS), weights=list(LENGTH_WEIGHTS.values()))[0]


def sample_trace(
    env: ToolEnv,
    graph: ApiGraph,
    target: str,
    rng: random.Random,
    length: int,
    stats: SamplerStats | None = None,
    exclude: set[str] = frozenset(),
    prior_outputs: list[tuple[str, Any]] = (),
) -> tuple[Trace, ToolEnv]:
    """A trace of up to `length` executed calls toward `target`, and the environment after it.

    `prior_outputs`: response entries of earlier turns of the same sample. They count as candidates
    (a value there is not unique if an earlier turn returned another one) but never as feeds of this
    trace: a value from them is one the user states.
    """
    name = env.spec.name
    tools = [t for t in env.spec.tool_names if t not in exclude]
    steps: list[Step] = []
    outputs: list[tuple[str, Any]] = list(prior_outputs)
    origin: list[int] = [-1] * len(outputs)  # step index of each entry in `outputs` (-1: an earlier turn)
    called: set[str] = set()
    hit = False
    blocked: set[str] = set()
    budget = length + 6
    while len(steps) < length and budget > 0:
        budget -= 1
        legal = [t for t in tools if set(graph.prerequisites(name, t)) <= called and t not in blocked]
        if not legal:
            break
        producers = [] if hit or target not in legal else _producers(graph, name, target, legal, called, steps)
        if producers and len(steps) < length - 1 and rng.random() < P_PRODUCER_FIRST:
            # its result will feed the target (a hidden intermediate step); edges the student fails on weigh more
            pick = rng.choices(producers, weights=[graph.edge_weight(name, p, target) for p in producers])[0]
        elif not hit and target in legal:
            pick = target
        elif not hit:
            fresh = [t for t in legal if t not in called] or legal
            best = min(graph.distance(name, t, target) for t in fresh)
            pick = rng.choice([t for t in fresh if graph.distance(name, t, target) == best])
        else:
            # a random legal tool, favouring those that consume an earlier result (HardGen's hidden steps)
            pool = [t for t in legal if t not in called] or legal
            # and the transitions the student fails on (edge weights from the closed loop)
            last = steps[-1].name if steps else None
            weights = [
                (3.0 if any(graph.g.has_edge(node(name, c), node(name, t)) for c in called) else 1.0)
                * (graph.edge_weight(name, last, t) if last else 1.0)
                for t in pool
            ]
            pick = rng.choices(pool, weights=weights)[0]
        new_env, ex = try_call(env, pick, outputs, rng, raw_outputs=[s.output for s in steps])
        if stats is not None:
            stats.record(name, pick, ex.ok)
        if not ex.ok:
            blocked.add(pick)
            if pick == target and not hit:
                target = None  # the target cannot run here: fall back to random legal tools
                hit = True
            continue
        blocked.clear()
        step = Step(pick, ex.arguments, ex.output)
        props = parameters(env.spec.doc(pick))
        for param, value in ex.arguments.items():
            found = _producer(value, outputs, param, props.get(param, {}))
            if found is not None and origin[found] >= 0:
                src = origin[found]
                step.feeds[param] = src
                step.feed_keys[param] = outputs[found][0]
                if stats is not None:
                    stats.flows.append((name, steps[src].name, outputs[found][0], pick, param))
            elif found is None and _distinctive(value):
                for src in range(len(steps) - 1, -1, -1):  # one of several records, picked by a criterion
                    best = superlative(value, steps[src].output, param, props.get(param, {}))
                    if best is not None:
                        step.feeds[param], step.feed_keys[param], step.selectors[param] = src, best[0], list(best[1:])
                        break
        env = new_env
        steps.append(step)
        called.add(pick)
        pairs = leaves(ex.output, "result")
        outputs += pairs
        origin += [len(steps) - 1] * len(pairs)
        if pick == target:
            hit = True
    target_hit = target is not None and any(s.name == target for s in steps)
    return Trace(name, target if target_hit else (steps[-1].name if steps else ""), steps, target_hit), env


def _distinctive(value: Any) -> bool:
    """An id, a token, a name: not a flag, a small number or a short string."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float) and abs(value) < 100:
        return False
    return not (isinstance(value, str) and len(value) < 3)


def _producer(value: Any, outputs: list, param: str, pspec: dict) -> int | None:
    """Index of the response entry that *produces* `value` for `param`, or None.

    Only a distinctive value (an id, a token, a name; not a small number or a
    flag) at a key that can feed the parameter (`compatible_key`), and only
    when it is the one candidate there: a value picked from a list of several
    is a choice the user must state, not an intermediate result.
    """
    if not _distinctive(value):
        return None
    candidates = unique_candidates(value, outputs, param, pspec)
    if candidates is None:
        return None
    for i in range(len(outputs) - 1, -1, -1):
        if outputs[i][1] == value and compatible_key(param, pspec, outputs[i][0]):
            return i
    return None
