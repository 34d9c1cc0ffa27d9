"""Directed trace sampler toward a target tool (HardGen).

legal(T) iff Prerequisite(T) ⊆ T_called. The target T_a is picked as soon
as it is legal (or, with probability `P_PRODUCER_FIRST`, right after a tool
whose output can feed it, chosen by edge weight); before that, the legal
tool nearest T_a in the API graph; after it nothing (the target ends the
trace, unless it cannot run here: then random legal tools, weighted toward
consumers of earlier results and by the weight of the edge from the previous
call; the closed loop raises the weights of edges the student fails on). Every call is executed on the live
environment (through forks: a call that fails is retried with other
arguments, then the tool is set aside for this step). A trace is
(C1, E1, ..., CM, EM), 1 to 8 calls, and ends with the target: the goal of
the request determines every step (no call after it). A step whose argument
the user would have to state although only an earlier output holds it (an id
just created, a token, a computed figure; not in the initial state) is
refused: the user could not know it. A finished trace keeps only the steps
its goal needs (`prune`, then by replay `coherence.needed_only`: a stated step that
neither feeds nor enables the goal goes).

Each step records where its argument values came from; a value equal to an
earlier response value is an observed output-to-input flow, and the earlier
step becomes a *hidden* step (its result is an intermediate value the
query will not state).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any

from palaestra.datagen.argfill import compatible_key, leaves, superlative, tokens, unique_candidates
from palaestra.datagen.coherence import needed_only, step_breaks_coherence
from palaestra.datagen.envs import ToolEnv
from palaestra.datagen.graph import ApiGraph, node, try_call
from palaestra.datagen.schema import parameters
from palaestra.shared.toolcall import call_string

P_PRODUCER_FIRST = 0.9
"""Chance to call a tool whose output can feed the target right before it (a hidden step), when there is one."""
P_CONSUMER = 0.3
"""Chance that the goal goes on from the target to a tool that consumes its result (the target becomes hidden)."""
P_CONSUMER_NO_FLOW = 0.9
"""The same chance when no step of the trace feeds another yet."""
MAX_CONSUMERS = 2
"""At most this many such steps."""
TARGET_RETRIES = 3
"""Right after a producer, calls of the target (other proposed arguments) tried before the producer is undone."""
LENGTH_WEIGHTS = {1: 0.04, 2: 0.12, 3: 0.24, 4: 0.26, 5: 0.16, 6: 0.1, 7: 0.05, 8: 0.03}
"""Trace length distribution (1-8 calls); with prerequisites and failures the mean lands near 3.5."""


@dataclass
class TraceStep:
    name: str
    arguments: dict
    output: Any
    feeds: dict[str, int] = field(default_factory=dict)
    """Parameter -> index of the earlier step whose response supplied its value."""
    feed_keys: dict[str, str] = field(default_factory=dict)
    """Parameter -> the response key it was read from."""
    prior_feeds: dict[str, str] = field(default_factory=dict)
    """Parameter -> the response key of an earlier *turn* that supplied its value (the only candidate there):
    the user refers to it ("the ticket you just created"), the model carries it across turns."""
    changes_state: bool = True
    """Whether the call changed the environment's public state (a read-only call that feeds nothing is pruned)."""
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
    steps: list[TraceStep]
    target_hit: bool
    parallel: bool = False
    """Independent calls made in one assistant message (`parallel`): every step is a stated goal."""

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
    exclude: AbstractSet[str] = frozenset(),
    prior_outputs: Sequence[tuple[str, Any]] = (),
    prior_arguments: Sequence[dict] = (),
    carry: dict | None = None,
    prior_raw: Sequence = (),
) -> tuple[Trace, ToolEnv]:
    """A trace of up to `length` executed calls toward `target`, and the environment after it.

    `prior_outputs`: response entries of earlier turns of the same sample. They count as candidates
    (a value there is not unique if an earlier turn returned another one); a value that is the only
    candidate there is carried over from that turn (`TraceStep.prior_feeds`), not stated, unless the user
    stated it in an earlier turn (`prior_arguments`: the arguments of earlier turns' calls). `carry`: parameter ->
    value, an earlier turn's result the target is to take (set in its call; no producer of this turn is called
    first to shadow it). `prior_raw`: earlier turns' responses, whole: a value that is one of several records
    there, singled out by a numeric field, is carried too, with that criterion (`TraceStep.selectors`).
    """
    name = env.spec.name
    start = env
    tools = [t for t in env.spec.tool_names if t not in exclude]
    steps: list[TraceStep] = []
    outputs: list[tuple[str, Any]] = list(prior_outputs)
    origin: list[int] = [-1] * len(outputs)  # step index of each entry in `outputs` (-1: an earlier turn)
    called: set[str] = set()
    hit = False
    # the initial state (the user's own data) and what earlier turns' calls were given
    known = json.dumps(env.scenario, default=str) + json.dumps(list(prior_arguments), default=str)
    said_before = TraceStep("", {f"{i}.{k}": v for i, a in enumerate(prior_arguments) for k, v in a.items()}, None)
    blocked: set[str] = set()
    budget = length + 6
    consuming = 0  # steps added after the target, each consuming an earlier result
    snapshot: tuple | None = None  # the state before a producer, restored if the target does not consume it
    tried: set[str] = set()  # producers whose result the target did not take
    retries = TARGET_RETRIES  # calls of the target after a producer, before the producer is undone
    while len(steps) < length and budget > 0:
        budget -= 1
        legal = [t for t in tools if set(graph.prerequisites(name, t)) <= called and t not in blocked]
        if not legal:
            break
        producers = [] if hit or target not in legal else _producers(graph, name, target, legal, called, steps)
        producers = [p for p in producers if p not in tried] if len(tried) < 2 and not carry else []
        if producers and len(steps) < 7 and rng.random() < P_PRODUCER_FIRST:
            # its result will feed the target (a hidden intermediate step); edges the student fails on weigh more
            pick = rng.choices(producers, weights=[graph.edge_weight(name, p, target) for p in producers])[0]
            snapshot = (env, list(steps), list(outputs), list(origin), set(called), pick)
        elif not hit and target in legal:
            pick = target
        elif not hit:
            fresh = [t for t in legal if t not in called] or legal
            best = min(graph.distance(name, t, target) for t in fresh)
            pick = rng.choice([t for t in fresh if graph.distance(name, t, target) == best])
        elif consuming:
            # the goal goes on to a tool that takes a result of the last call as input (a hidden step)
            pool = [
                t
                for t in legal
                if t not in called
                and "mapping" in graph.g.get_edge_data(node(name, steps[-1].name), node(name, t), {}).get("kinds", [])
            ]
            if not pool:
                break
            pick = rng.choices(pool, weights=[graph.edge_weight(name, steps[-1].name, t) for t in pool])[0]
        else:
            # the target cannot run: a random legal tool, favouring those that consume an earlier result
            pool = [t for t in legal if t not in called] or legal
            # and the transitions the student fails on (edge weights from the closed loop)
            last = steps[-1].name if steps else None
            weights = [
                (3.0 if any(graph.g.has_edge(node(name, c), node(name, t)) for c in called) else 1.0)
                * (graph.edge_weight(name, last, t) if last else 1.0)
                for t in pool
            ]
            pick = rng.choices(pool, weights=weights)[0]
        fixed = carry if carry and pick == target else None
        new_env, ex = try_call(env, pick, outputs, rng, raw_outputs=[s.output for s in steps], fixed=fixed)
        if stats is not None:
            stats.record(name, pick, ex.ok)
        if not ex.ok:
            blocked.add(pick)
            if pick == target and not hit:
                target = None  # type: ignore[assignment]  # the target cannot run here: random legal tools
                hit = True
            if consuming:
                break
            continue
        step = TraceStep(pick, ex.arguments, ex.output)
        props = parameters(env.spec.doc(pick))
        for param, value in ex.arguments.items():
            found = _producer(value, outputs, param, props.get(param, {}))
            if found is not None and origin[found] >= 0 and not any(_echo(value, x) for x in steps):
                src = origin[found]
                step.feeds[param] = src
                step.feed_keys[param] = outputs[found][0]
                if stats is not None:
                    stats.flows.append((name, steps[src].name, outputs[found][0], pick, param))
            elif found is not None and origin[found] < 0 and not any(_echo(value, x) for x in [*steps, said_before]):
                step.prior_feeds[param] = outputs[found][0]  # an earlier turn's result, carried over
            elif found is None and (_distinctive(value) or _small_id(value, param)):
                for src in range(len(steps) - 1, -1, -1):  # one of several records, picked by a criterion
                    pick_by = superlative(value, steps[src].output, param, props.get(param, {}))
                    if pick_by is not None:
                        step.feeds[param], step.feed_keys[param] = src, pick_by[0]
                        step.selectors[param] = list(pick_by[1:])
                        break
                else:  # ... or of the records an earlier turn listed ("the one with the highest priority")
                    for raw in reversed(prior_raw):
                        pick_by = superlative(value, raw, param, props.get(param, {}))
                        if pick_by is not None and not any(_echo(value, x) for x in [*steps, said_before]):
                            step.prior_feeds[param] = pick_by[0]
                            step.selectors[param] = list(pick_by[1:])
                            break
        if consuming and steps[-1] is not None and len(steps) - 1 not in step.feeds.values():
            break  # it would not consume the last result: the goal ends where it is
        if step_breaks_coherence(step, steps, env.spec.doc(pick)):
            if consuming:
                break
            blocked.add(pick)  # a hidden state change, a value of another kind, an empty range: not this call
            continue
        if _leaks(step, outputs, known + json.dumps([x.arguments for x in steps], default=str), props):
            if consuming:
                break
            blocked.add(pick)  # a value only a tool output gives, not fed: the user could not state it
            if stats is not None:
                stats.record(name, pick, False)
            continue
        blocked.clear()
        step.changes_state = not env.same_state(new_env)
        before_target = env
        env = new_env
        steps.append(step)
        called.add(pick)
        pairs = leaves(ex.output, "result")
        outputs += pairs
        origin += [len(steps) - 1] * len(pairs)
        if pick == target and snapshot is not None:
            producer_at = len(snapshot[1])
            if producer_at not in step.feeds.values() and retries > 0:
                # the target took nothing from it: call the target again with other arguments
                retries -= 1
                env, steps, called = before_target, steps[:-1], called - {target}
                outputs, origin = outputs[: len(outputs) - len(pairs)], origin[: len(origin) - len(pairs)]
                budget += 1
                continue
            env_s, steps_s, outputs_s, origin_s, called_s, producer = snapshot
            snapshot, retries = None, TARGET_RETRIES
            if producer_at not in step.feeds.values():  # still nothing taken: undo both calls
                env, steps, outputs, origin, called = env_s, steps_s, outputs_s, origin_s, called_s
                tried.add(producer)
                budget += 2  # the undone attempt does not count
                continue
        if pick == target or consuming:
            hit = True
            consuming += 1
            flow = any(x.feeds for x in steps)
            if consuming > MAX_CONSUMERS or rng.random() >= (P_CONSUMER if flow else P_CONSUMER_NO_FLOW):
                break  # the goal is reached: no step the request did not ask for
    target_hit = target is not None and any(s.name == target for s in steps)
    if steps:
        kept = prune(list(steps), lambda tool: graph.prerequisites(name, tool))
        if len(kept) < len(steps):  # a dropped call may have moved an environment's random state: replay
            replay = start.copy()
            outs = [replay.execute(s.name, s.arguments).output for s in kept]
            if json.dumps(outs, sort_keys=True, default=str) == json.dumps(
                [s.output for s in kept], sort_keys=True, default=str
            ) and replay.same_state(env):
                steps, env = kept, replay
        steps, env = needed_only(start, steps, env, lambda tool: graph.prerequisites(name, tool))

    # the goal is the last call: the target, or a tool that consumes its result
    return Trace(name, steps[-1].name if steps else "", steps, target_hit), env


def _echo(value: Any, producer: TraceStep) -> bool:
    """A value an earlier step was given (``get_ticket(ticket_id=7)`` returns id 7): no hidden value, the user
    said it."""
    return any(value == v or (isinstance(v, list) and value in v) for v in producer.arguments.values())


def prune(steps: list[TraceStep], prerequisites=lambda tool: ()) -> list[TraceStep]:
    """The steps the goal needs: the target (last), every step whose result feeds a kept step, every step that
    changes the state, and every call of a kept step's prerequisite tool (`prerequisites(tool)`). A read-only call
    that feeds nothing is dropped; dropping it changes no later result, so the trace still replays."""
    keep = {len(steps) - 1}
    needed: set[str] = set()
    for i in range(len(steps) - 1, -1, -1):
        if i in keep or steps[i].changes_state or steps[i].name in needed:
            keep.add(i)
            keep |= set(steps[i].feeds.values())
            needed |= set(prerequisites(steps[i].name))
    index = {old: new for new, old in enumerate(sorted(keep))}
    return [replace(steps[i], feeds={p: index[src] for p, src in steps[i].feeds.items()}) for i in sorted(keep)]


def _leaks(step: TraceStep, outputs: list, known: str, props: dict) -> bool:
    """Whether an argument the user would have to state (not fed, not a default) is an id, a token or a
    computed figure that an earlier output returned and `known` (the initial state, the values stated for
    earlier steps) does not hold: only a tool could produce it."""
    for param, value in step.arguments.items():
        if param in step.feeds or param in step.prior_feeds or props.get(param, {}).get("default") == value:
            continue
        for v in value if isinstance(value, list) else [value]:
            if _unknowable(v) and any(x == v for _, x in outputs) and str(v) not in known:
                return True
    return False


def _unknowable(v: Any) -> bool:
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, float) and not v.is_integer():
        return True
    if isinstance(v, int | float):
        return abs(v) >= 1000
    return isinstance(v, str) and len(v) >= 3


def _small_id(value: Any, param: str) -> bool:
    """A small integer for an id parameter (``tweet_id=3``): an id when the only candidate is at an id key."""
    return isinstance(value, int) and not isinstance(value, bool) and "id" in tokens(param)


def _distinctive(value: Any) -> bool:
    """An id, a token, a name, a computed figure: not a flag, a small round number or a short string."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, float) and not value.is_integer() and len(repr(value).split(".")[-1]) >= 3:
        return True  # a computed figure (13.2489): no literal a user would say coincides with it
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
    if not (_distinctive(value) or _small_id(value, param)):
        return None
    candidates = unique_candidates(value, outputs, param, pspec)
    if candidates is None:
        return None
    for i in range(len(outputs) - 1, -1, -1):
        if outputs[i][1] == value and compatible_key(param, pspec, outputs[i][0]):
            return i
    return None
