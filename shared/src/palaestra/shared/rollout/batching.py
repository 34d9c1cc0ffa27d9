"""The rollout engine's generate calls: its waiting requests grouped by what samples them, one call per group.

A group is the requests of one client (each agent's policy, `RolloutEngine.route`), generated in one call under
that client's newest weights (`PolicyVersion.generating`), every token tagged with the version then held.
Identical prompts in runs of equal length (a GRPO group's first turn) go out as one prompt with ``n``
completions. Under ``newest`` ahead of the learner an interruptible client (the transformers decode loop, vLLM
in segments) also takes newer weights inside the call.

LoRA policies served by one vLLM engine (`VLLMAdapterClient`, whose ``mixed_batches`` names that engine) share
one group: one call serves every adapter's requests, each with its own ``LoRARequest``, as vLLM's multi-LoRA
batching does, and each request's tokens carry its own adapter's version (`VLLMClient.generate_mixed`). Such a
call holds every adapter's weights for its whole length (it is not interruptible).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from palaestra.shared.llm.base import Completion, SamplingParams


@dataclass
class Group:
    """Waiting requests sampled in one generate call: per request its sampler (`engine._Sampler`)."""

    samplers: list[Any] = field(default_factory=list)
    items: list[Any] = field(default_factory=list)


def group_requests(waiting: list, sampler_of: Callable[[Any], Any]) -> list[Group]:
    """`waiting` grouped by the client (or, for adapters of one vLLM engine, the engine) that samples each, in the
    order their first requests wait."""
    groups: dict[int, Group] = {}
    for item in waiting:
        sampler = sampler_of(item)
        engine = getattr(sampler.client, "mixed_batches", None)
        group = groups.setdefault(id(engine if engine is not None else sampler.client), Group())
        group.samplers.append(sampler)
        group.items.append(item)
    return list(groups.values())


def generate(group: Group, prompts: list[list[int]], params: SamplingParams, newest: bool) -> list[tuple[Any, int]]:
    """The group's completions, one per request, each with the policy version that sampled it (the version the
    call began with; an interruptible call tags each token in ``extra["token_versions"]``)."""
    distinct = list({id(s): s for s in group.samplers}.values())
    if len(distinct) == 1:
        sampler = distinct[0]
        with sampler.policy.generating() as version:
            interrupt = {"at_boundary": sampler.policy.at_boundary} if newest and sampler.client.interruptible else {}
            completions = _one_client(sampler.client, prompts, params, interrupt)
        return [(c, version) for c in completions]
    with ExitStack() as stack:  # every adapter's newest weights, held for the one call
        held = {id(s): stack.enter_context(s.policy.generating()) for s in distinct}
        engine = distinct[0].client.mixed_batches
        adapters = [s.client.adapter for s in group.samplers]
        keys = [(a, tuple(p)) for a, p in zip(adapters, prompts)]
        n = uniform_run_length(keys)
        if n > 1:
            params.n, prompts, adapters = n, prompts[::n], adapters[::n]
        completions = engine.generate_mixed(prompts, params, adapters)
    return [(c, held[id(s)]) for c, s in zip(completions, group.samplers)]


def _one_client(client: Any, prompts: list[list[int]], params: SamplingParams, interrupt: dict) -> list[Completion]:
    n = uniform_run_length(prompts)
    if n > 1:  # every prompt repeats n times in a row: one prompt, n samples
        params.n, prompts = n, prompts[::n]
    return client.generate(prompts, params, **interrupt)


def uniform_run_length(prompts: list) -> int:
    """k if `prompts` is made of consecutive runs of k identical prompts (k > 1), else 1."""
    if len(prompts) < 2:
        return 1
    k = 1
    while k < len(prompts) and prompts[k] == prompts[0]:
        k += 1
    if k == 1 or len(prompts) % k:
        return 1
    for start in range(0, len(prompts), k):
        run = prompts[start : start + k]
        if any(p != run[0] for p in run) or (start + k < len(prompts) and prompts[start + k] == run[0]):
            return 1
    return k
