"""The ``policies`` section's light half: each policy's config (`policy_config`), whether the policies share one
base model (`shares_base`) and the section's value check. No torch: ``--dry-run``, ``show`` and ``plan`` use it;
rl/policies.py builds the models."""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING

from palaestra.shared.rl.config import check_learner_llm
from palaestra.shared.rollout.vllm_weight_sync import WeightSync

if TYPE_CHECKING:
    from palaestra.shared.rl.config import TrainConfig

DEFAULT = "policy"
"""The one policy's name when the config has no ``policies`` section."""
WORKER_BACKENDS = ("transformers", "vllm")
"""The backends whose rollout workers serve several policies: LoRA adapters on one base or a model each
(rollout/serving.py `serve`)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def check_policies(value: dict, owner: TrainConfig) -> str | None:
    """Config check of ``policies``: safe names, no agent named twice, at most one catch-all, each own model
    one the learner can train, and what rollout workers can serve."""
    seen: dict[str, str] = {}
    catch_all = [name for name, spec in value.items() if not spec.agents]
    if len(catch_all) > 1:
        return f"policies {', '.join(catch_all)} all leave agents empty; at most one may play the agents not named"
    for name, spec in value.items():
        if not _NAME.match(name):
            return f"policy name {name!r}: letters, digits, '_' and '-' only (it names a checkpoint directory)"
        for agent in spec.agents:
            if agent in seen:
                return f"agent {agent!r} is in policies {seen[agent]} and {name}; each agent has one policy"
            seen[agent] = name
        if spec.llm is not None and (problem := check_learner_llm(spec.llm, owner)):
            return f"{name}.llm: {problem}"
    return _sharding_problem(owner) or _serving_problem(owner)


def _sharding_problem(cfg: TrainConfig) -> str | None:
    for name in list(cfg.policies) or [DEFAULT]:  # each policy may have a sharded learner of its own
        pcfg = policy_config(cfg, name) if cfg.policies else cfg
        if pcfg.learner.world_size > 1 and pcfg.lora.enabled:
            where = f"policy {name}: " if cfg.policies else ""
            return f"{where}learner.world_size > 1 does not support LoRA (lora.enabled); use world_size 1"
    return None


def _serving_problem(cfg: TrainConfig) -> str | None:
    """What rollout workers cannot serve of several policies."""
    if len(cfg.policies) < 2 or cfg.workers.num_workers == 0:
        return None
    backend = (cfg.workers.llm or cfg.llm).backend
    own_llm = [name for name, spec in cfg.policies.items() if spec.llm is not None]
    if not shares_base(cfg) and cfg.workers.llm is not None and own_llm:
        return (
            f"workers.llm names one model for every rollout worker, but policies {', '.join(own_llm)} "
            "have an llm of their own; leave workers.llm unset (each policy's model is then served as its llm)"
        )
    if cfg.workers.weight_sync != WeightSync.object_store:
        return (
            "rollout workers get several policies' weights (models or LoRA adapters) through Ray's object "
            f"store only; set workers.weight_sync object_store (got {cfg.workers.weight_sync})"
        )
    if backend not in WORKER_BACKENDS:
        what = "LoRA adapters" if shares_base(cfg) else "several policies' own models"
        return (
            f"rollout workers serve {what} on the {' and '.join(WORKER_BACKENDS)} backends only "
            f"(the workers' llm.backend is {backend})"
        )
    if not shares_base(cfg) and backend == "vllm":  # one engine per policy on each worker
        share = (cfg.workers.llm or cfg.llm).gpu_memory_utilization
        if share * len(cfg.policies) > 0.95:
            return (
                f"each of the {len(cfg.policies)} policies gets a vLLM engine of its own on every rollout worker, "
                f"each taking llm.gpu_memory_utilization={share:g} of the GPU; set it to at most "
                f"{0.95 / len(cfg.policies):.2f} (workers.llm.gpu_memory_utilization)"
            )
    return None


def policy_config(cfg: TrainConfig, name: str) -> TrainConfig:
    """The run's config with policy `name`'s own sections in place of the run's (a shallow copy: the other
    sections are the run's own objects)."""
    spec = cfg.policies[name]
    out = copy.copy(cfg)
    for section in ("llm", "lora", "optim", "learner"):
        own = getattr(spec, section)
        if own is not None:
            setattr(out, section, own)
    return out


def shares_base(cfg: TrainConfig) -> bool:
    """Several policies with LoRA on the same model and the same adapter settings: one base model holds one
    adapter per policy (the base is frozen, so a copy per policy would hold the same weights)."""
    if len(cfg.policies) < 2:
        return False
    own = [policy_config(cfg, name) for name in cfg.policies]
    return all(c.lora.enabled and c.llm == own[0].llm and c.lora == own[0].lora for c in own)
