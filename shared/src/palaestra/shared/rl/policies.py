"""Several policies in one run: each plays some agents (seats, roles) and trains on their turns alone.

A ``policies:`` section (`TrainConfig.policies`, `PolicySpec` in rl/config.py) names the policies, the
agents each plays, and what each has of its own; every unset section is the run's::

    policies:
      first:  {agents: [player_0]}                       # the run's llm, optim, learner, lora
      second: {agents: [player_1], optim: {lr: 1.0e-4}}  # its own optimizer settings

Each policy is a `TrainedPolicy`: its model (separate weights, float32 master copy), optimizer, learner, frozen
reference, checkpoint section and metric names. The run holds a `PolicySet`, also of one policy: the rollout
engine samples every agent's turn from its policy's client (`PolicySet.client_of`); the trainer
(rl/trainer.py) splits the step's trajectories by agent (`PolicySet.split`) and runs the advantage pipeline,
the update and the learning-rate schedule per policy on its own rows, logging ``policy/<name>/...`` metrics
when there are several.

LoRA on one model (``lora.enabled``, no policy with its own ``llm`` or ``lora``): the policies are adapters
(``policy_<name>``) on one base model (`shares_base`): each client generates with its adapter active
(`AdapterClient`), each learner activates it before its forwards, each optimizer and checkpoint holds it
alone; the KL reference is the base (adapters off). Rollout workers serve them the same way
(`worker_serving`, rollout/serving.py), the weight sync sending the adapters' tensors alone (`adapter_states`):
on the transformers backend as peft adapters on the worker's model, on vLLM with vLLM's multi-LoRA serving (one
engine started for the adapters; each agent's requests carry its adapter's ``LoRARequest``;
llm/vllm_backend.py). The adapters travel through Ray's object store (megabytes), not over NCCL.

Policies with a model each (separate weights, possibly each its own ``llm``): rollout workers hold one model
per policy (`worker_serving`; on the transformers backend, or a vLLM engine each) and route each
agent's turns to its policy's; the weight sync sends every policy's weights by policy (`PolicySet.weights`),
each loading into its own policy's model alone (rollout/workers.py `Replica`), through Ray's object store (NCCL
and a ``workers.llm`` beside policies' own ``llm`` are refused). Rollouts ahead of the learner
(``rollout.max_staleness`` > 0, rl/async_rollouts.py) work with several policies too: in-process, the background
engine holds a copy of every policy's model (or of the base with every adapter); on Ray, the workers' replicas
take each policy's weights of the pinned or offered version; each policy's client tags its tokens with its own
weights' version.

Sharded learners (``learner.world_size`` > 1, the run's or a policy's own): each such policy has a sharded
learner of its own (rl/distributed.py: its ranks and process group, its optimizer and learner settings, its
reference, its shards under its checkpoint subdirectory); LoRA stays on world size 1.

No section: one policy (named ``policy``) plays every agent, as self-play always did; its checkpoints and
metrics keep their single-policy layout and names. A section with one policy trains exactly the same
(the same weights and metrics bit for bit); its checkpoints take the per-policy layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from palaestra.shared.config import ConfigError
from palaestra.shared.llm.base import LLMClient, LLMConfig
from palaestra.shared.llm.lora import AdapterClient, peft_config
from palaestra.shared.rl import checkpoint
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.optim_offload import optimizer_for
from palaestra.shared.rl.policy import load_policy, policy_state, reference_copy, reference_dtype, think_token_ids
from palaestra.shared.rl.policy_configs import DEFAULT, policy_config, shares_base
from palaestra.shared.rollout.serving import AdapterServing, ModelServing, PolicyRoutes, Serving
from palaestra.shared.rollout.trajectory import Trajectory


@dataclass
class TrainedPolicy:
    """One trained policy: the agents it plays, its config (the run's with its own sections) and its parts."""

    name: str
    cfg: TrainConfig
    agents: tuple[str, ...]
    client: Any  # LLMClient; `AdapterClient` on a shared base
    model: torch.nn.Module
    compute_dtype: torch.dtype
    optimizer: torch.optim.Optimizer
    ref_model: torch.nn.Module | None = None
    learner: Any = None  # rl/learner.py `Learner`, started by the trainer's `prepare`
    adapter: str | None = None
    """Its LoRA adapter when the policies share one base model (`shares_base`): ``model`` is that peft model."""
    section: str = ""
    """Its checkpoint subdirectory: its name with a ``policies`` section, else "" (the step directory)."""
    metric_prefix: str = ""
    """What its metrics' names start with: ``policy/<name>/`` when the run trains several, else ""."""
    think_ids: Any = None
    """Its tokenizer's ``<think>`` markers (rl/policy.py `think_token_ids`)."""

    @property
    def tokenizer(self) -> Any:
        return self.client.tokenizer

    @property
    def reference_dir(self) -> Path:
        """Where its reference/ lives under the checkpoints (rl/checkpoint.py)."""
        return Path("policies", self.name) if self.section else Path()

    @property
    def learner_name(self) -> str:
        """How messages name its learner."""
        return f"policy {self.name}'s learner" if self.section else "the learner"

    def reference_copy(self) -> torch.nn.Module:
        """A frozen copy of its model as its KL reference, in the compute dtype (rl/policy.py `reference_copy`)."""
        return reference_copy(self.model, reference_dtype(self.compute_dtype))

    def checkpoint_part(self) -> checkpoint.Part:
        return checkpoint.Part(self.section, self.model, self.optimizer, self.tokenizer, self.adapter)


class PolicySet(Sequence[TrainedPolicy]):
    """Every policy of a run, in the section's order: one without a ``policies`` section.

    The trainer asks the set, never how many policies there are: who plays an agent, which rows each trains
    on, what the rollouts serve and load, and what a checkpoint holds.
    """

    def __init__(self, policies: list[TrainedPolicy]):
        self.policies = policies

    def __getitem__(self, i):  # type: ignore[override]
        return self.policies[i]

    def __len__(self) -> int:
        return len(self.policies)

    @property
    def base_client(self) -> Any:
        """The client the rollout engine is built on (its tokenizer and context length): the first policy's."""
        return self.policies[0].client

    def of(self, agent: str) -> TrainedPolicy:
        return policy_of(self.policies, agent)

    def client_of(self, agent: str) -> LLMClient:
        """The client that samples `agent`'s turns (the rollout engine's route)."""
        return self.of(agent).client

    def clients(self) -> list[LLMClient]:
        return [p.client for p in self.policies]

    def split(self, trajs: Sequence[Trajectory]) -> list[tuple[TrainedPolicy, list[Trajectory]]]:
        """The trajectories of each policy's agents, in the policies' order (a policy with none is left out);
        the trajectories keep their order."""
        rows: dict[str, list[Trajectory]] = {p.name: [] for p in self.policies}
        for t in trajs:
            rows[self.of(t.agent).name].append(t)
        return [(p, rows[p.name]) for p in self.policies if rows[p.name]]

    def eval(self) -> None:
        """Every model in eval mode (no dropout) for rollouts and scoring."""
        for p in self.policies:
            p.model.eval()

    def serving(self, llm: LLMConfig | None = None) -> Serving | None:
        """What a rollout worker serves besides its own client (`worker_serving`)."""
        return worker_serving(self.policies, llm)

    def weights(self) -> dict[str, Any]:
        """What the rollouts load after an update, shaped as `serving` says: the adapters' tensors alone by
        adapter, or each model's weights by policy; one policy's weights as they are (LoRA merged in)."""
        serving = self.serving()
        if isinstance(serving, AdapterServing):
            return adapter_states(self.policies)
        if isinstance(serving, ModelServing):
            return {p.name: policy_state(p.model, p.cfg.lora.enabled) for p in self.policies}
        (only,) = self.policies
        return policy_state(only.model, only.cfg.lora.enabled)

    def warm_start(self, sft: Callable[[TrainedPolicy], dict[str, float]]) -> dict[str, float]:
        """`sft` on the first policy; every other starts from it (`warm_start_from`). Returns its metrics."""
        first, *others = self.policies
        metrics = sft(first)
        for p in others:
            warm_start_from(p, first, sft)
        return metrics

    def checkpoint_parts(self) -> list[checkpoint.Part]:
        return [p.checkpoint_part() for p in self.policies]


def build_policies(cfg: TrainConfig) -> PolicySet:
    """Every policy of the run with its model and optimizer built (in the section's order; no section: one)."""
    names = list(cfg.policies) or [DEFAULT]  # checked by rl/policy_configs.py `check_policies`
    if shares_base(cfg):
        out = _adapters_on_one_base(cfg)
    else:
        out = []
        for name in names:
            pcfg = policy_config(cfg, name) if cfg.policies else cfg
            client, model, compute_dtype = load_policy(pcfg)  # float32 master weights
            trained = (p for p in model.parameters() if p.requires_grad)
            optimizer = optimizer_for(trained, pcfg.optim, pcfg.learner.optimizer_offload)  # rl/optim_offload.py
            agents = tuple(cfg.policies[name].agents) if cfg.policies else ()
            out.append(TrainedPolicy(name, pcfg, agents, client, model, compute_dtype, optimizer))
    for p in out:  # where each keeps its checkpoint and metrics, decided once here
        p.section = p.name if cfg.policies else ""
        p.metric_prefix = f"policy/{p.name}/" if len(out) > 1 else ""
        p.think_ids = think_token_ids(p.tokenizer)
    return PolicySet(out)


def _adapters_on_one_base(cfg: TrainConfig) -> list[TrainedPolicy]:
    """One base model with an adapter per policy (``policy_<name>``: peft reloads wrongly an adapter whose name
    is part of ``lora_``); each policy's client generates with its adapter active and its optimizer holds its
    adapter's weights alone."""
    names = list(cfg.policies)
    adapters = {name: f"policy_{name}" for name in names}
    client, model, compute_dtype = load_policy(policy_config(cfg, names[0]), adapter=adapters[names[0]])
    peft_model: Any = model  # a peft model (LoRA on)
    for name in names[1:]:
        peft_model.add_adapter(adapters[name], peft_config(policy_config(cfg, name).lora))
    peft_model.set_adapter(adapters[names[0]])
    out = []
    for name, adapter in adapters.items():
        pcfg = policy_config(cfg, name)
        own = [p for n, p in model.named_parameters() if "lora_" in n and f".{adapter}." in n]
        optimizer = optimizer_for(own, pcfg.optim, pcfg.learner.optimizer_offload)
        agents = tuple(cfg.policies[name].agents)
        client_ = AdapterClient(client, model, adapter)
        out.append(TrainedPolicy(name, pcfg, agents, client_, model, compute_dtype, optimizer, adapter=adapter))
    return out


def adapter_states(policies: Sequence[TrainedPolicy]) -> dict[str, dict[str, torch.Tensor]]:
    """Every policy's adapter weights alone, by adapter (what rollout workers holding the base need after an
    update: megabytes, not the model)."""
    from peft import get_peft_model_state_dict

    return {p.adapter: get_peft_model_state_dict(p.model, adapter_name=p.adapter) for p in policies if p.adapter}


def worker_serving(policies: Sequence[TrainedPolicy], llm: LLMConfig | None = None) -> Serving | None:
    """What a rollout worker needs to serve several policies (rollout/serving.py; it travels to Ray actors):
    the adapters on one base, or each policy's model (`llm`, the workers' own, else the policy's llm).
    None with one policy: the worker's own client serves it."""
    if len(policies) < 2:
        return None
    routes = PolicyRoutes(
        agents={agent: p.adapter or p.name for p in policies for agent in p.agents},
        default=next((p.adapter or p.name for p in policies if not p.agents), None),
    )
    if policies[0].adapter is not None:
        return AdapterServing(policies[0].cfg.lora, tuple(p.adapter or p.name for p in policies), routes)
    return ModelServing({p.name: llm or p.cfg.llm for p in policies}, routes)


def policy_of(policies: Sequence[TrainedPolicy], agent: str) -> TrainedPolicy:
    """The policy that plays `agent`: the one naming it, else the one naming no agents."""
    for p in policies:
        if agent in p.agents:
            return p
    for p in policies:
        if not p.agents:
            return p
    named = ", ".join(f"{p.name}: {list(p.agents)}" for p in policies)
    raise ConfigError(f"agent {agent!r} has no policy (policies: {named}); add it to one policy's agents")


def warm_start_from(policy: TrainedPolicy, first: TrainedPolicy, sft: Callable[[TrainedPolicy], Any]) -> None:
    """Give `policy` the first policy's warm start: its weights where the two have the same model and adapters
    (the same start exactly), else `sft` run on `policy`'s own model."""
    if policy.adapter is not None and first.adapter is not None:  # adapters on one base: the first's adapter
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        state = get_peft_model_state_dict(first.model, adapter_name=first.adapter)
        set_peft_model_state_dict(policy.model, state, adapter_name=policy.adapter)
    elif policy.cfg.llm == first.cfg.llm and policy.cfg.lora == first.cfg.lora:
        policy.model.load_state_dict(first.model.state_dict())
    else:
        sft(policy)


def update_policies(
    splits: list[tuple[TrainedPolicy, list[Trajectory]]], update: Callable[[TrainedPolicy, list[Trajectory]], Any]
) -> list[tuple[TrainedPolicy, Any]]:
    """``update(policy, rows)`` for each policy's rows (`PolicySet.split`), results in the policies' order: at once
    when every policy has a sharded learner of its own (its ranks are its own processes and devices: the driver
    only waits on them), else one after another (learners in this process share its device, and LoRA adapters
    share one base model). Each policy's update reads only its own state, so the order changes no result."""
    own_ranks = all(p.adapter is None and getattr(p.learner, "world_size", 1) > 1 for p, _ in splits)
    if len(splits) < 2 or not own_ranks:
        return [(p, update(p, rows)) for p, rows in splits]
    with ThreadPoolExecutor(len(splits), thread_name_prefix="policy-update") as pool:
        futures = [(p, pool.submit(update, p, rows)) for p, rows in splits]
        return [(p, f.result()) for p, f in futures]
