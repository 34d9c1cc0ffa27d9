"""Named GPU layouts of an RL config (``layout``): where the learner, the rollout engines and the trainer's
process sit, selected by one key (``layout=gpu1_colocated``) and planned by `palaestra plan`.

A named layout owns the placement keys (`PLACEMENT`): the learner's ranks and GPUs, the rollout workers and
their GPUs, the vLLM engine's memory share and sleep mode, ``llm.device`` and ``cluster.num_gpus``. It sets them
when the config resolves (`apply_layout`, from `TrainConfig.__post_init__`); a config that also sets one of
them to another value is a one-line error naming the key (``layout: custom`` keeps the config's own keys); a key
set to its default value cannot be told from an unset one, so the layout's value replaces it silently.

- ``custom``: the config's own keys, nothing set;
- ``node8_split``: one node of 8 GPUs, 4 learner ranks (FSDP2) + 3 vLLM workers + the trainer's process on
  the eighth (its float32 copy for rollouts' weights, evaluation and checkpoints);
- ``node8_colocated``: one node of 8 GPUs, each holding one learner rank (FSDP2 over 8) and one vLLM engine
  (verl's hybrid engine, TRL's colocate mode): the rank asks 0.51 of a GPU and the engine 0.49, so Ray, which
  places the ranks first, cannot put two ranks or two engines on one GPU; the trainer's copy is in CPU memory
  and the weights travel through Ray's object store; each engine sleeps through the update (llm/sleep_mode.py);
- ``gpu1_colocated``: one GPU holding the learner in the trainer's process and one vLLM engine that sleeps
  through the update (Qwen3-4B: a 141 GB GPU);
- ``gpu1_offload``: the same with AdamW's state in CPU memory and stepped there (rl/optim_offload.py), which
  brings Qwen3-4B within an 80 GB GPU at the cost of host copies and CPU arithmetic at each optimizer step.

The colocated layouts need synchronous rollouts (``rollout.max_staleness`` 0): a sleeping engine cannot run
ahead of the learner.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from palaestra.shared.config_checks import ConfigError


class Layout(StrEnum):
    """A named GPU layout (see the module docstring)."""

    custom = "custom"
    node8_split = "node8_split"
    node8_colocated = "node8_colocated"
    gpu1_colocated = "gpu1_colocated"
    gpu1_offload = "gpu1_offload"


@dataclass(frozen=True)
class LayoutSpec:
    """The placement a named layout sets."""

    gpus: int
    """GPUs the layout uses (the plan's count)."""
    colocated: bool
    """Learner and vLLM share each GPU; the engines sleep through the update."""
    llm_device: str
    cluster_gpus: int
    learner_world_size: int
    learner_num_gpus: float
    num_workers: int
    worker_gpus: float
    vllm_memory_utilization: float | None
    """vLLM's share of its GPU while awake (its weights, activations and KV cache); None: the config's."""
    weight_sync: str
    optimizer_offload: bool = False
    """AdamW's state in CPU memory (rl/optim_offload.py)."""


LAYOUTS: dict[Layout, LayoutSpec] = {
    Layout.node8_split: LayoutSpec(
        gpus=8, colocated=False, llm_device="cuda:7", cluster_gpus=7, learner_world_size=4, learner_num_gpus=1,
        num_workers=3, worker_gpus=1, vllm_memory_utilization=0.7, weight_sync="object_store",
    ),
    Layout.node8_colocated: LayoutSpec(
        gpus=8, colocated=True, llm_device="cpu", cluster_gpus=8, learner_world_size=8, learner_num_gpus=0.51,
        num_workers=8, worker_gpus=0.49, vllm_memory_utilization=0.65, weight_sync="object_store",
    ),
    Layout.gpu1_colocated: LayoutSpec(
        gpus=1, colocated=True, llm_device="cuda:0", cluster_gpus=1, learner_world_size=1, learner_num_gpus=0,
        num_workers=1, worker_gpus=0.49, vllm_memory_utilization=0.4, weight_sync="object_store",
    ),
    Layout.gpu1_offload: LayoutSpec(
        gpus=1, colocated=True, llm_device="cuda:0", cluster_gpus=1, learner_world_size=1, learner_num_gpus=0,
        num_workers=1, worker_gpus=0.49, vllm_memory_utilization=0.62, weight_sync="object_store",
        optimizer_offload=True,
    ),
}  # fmt: skip
"""The vLLM shares hold one sequence of Qwen3-4B-Instruct-2507's whole 262,144-token context on an 80 GB GPU (141
for gpu1_colocated), what vLLM needs to start, beside what the learner keeps (`palaestra plan` checks both)."""


PLACEMENT = (
    "llm.device",
    "cluster.num_gpus",
    "learner.world_size",
    "learner.num_gpus",
    "workers.num_workers",
    "workers.num_gpus",
    "workers.weight_sync",
    "workers.llm.gpu_memory_utilization",
    "workers.llm.sleep_mode",
    "learner.optimizer_offload",
)
"""The keys a named layout sets."""


def layout_values(spec: LayoutSpec) -> dict[str, Any]:
    """The `PLACEMENT` keys' values under `spec` (a None left out: the config's own)."""
    values = dict(
        zip(
            PLACEMENT,
            (
                spec.llm_device,
                spec.cluster_gpus,
                spec.learner_world_size,
                spec.learner_num_gpus,
                spec.num_workers,
                spec.worker_gpus,
                spec.weight_sync,
                spec.vllm_memory_utilization,
                spec.colocated,
                spec.optimizer_offload,
            ),
        )
    )
    return {k: v for k, v in values.items() if v is not None}


def _owner_of(root: Any, key: str) -> tuple[Any, str]:
    *path, last = key.split(".")
    for part in path:
        root = getattr(root, part)
    return root, last


def apply_layout(cfg: Any) -> None:
    """Set `cfg`'s placement keys from its named ``layout`` (a `TrainConfig`; ``custom``: nothing). A key the
    config set to a value other than its default and the layout's is a `ConfigError` naming it. Idempotent."""
    sleeping = cfg.workers.llm is not None and cfg.workers.llm.sleep_mode
    if cfg.layout == Layout.custom:
        if sleeping and cfg.rollout.max_staleness:
            raise ConfigError("workers.llm.sleep_mode: a sleeping engine cannot run ahead: set rollout.max_staleness=0")
        return
    if cfg.layout not in LAYOUTS:  # a value built in code, past OmegaConf's enum check
        raise ConfigError(f"layout: unknown layout {cfg.layout!r}; known: {', '.join(Layout)}")
    spec = LAYOUTS[Layout(cfg.layout)]
    if cfg.workers.llm is None or cfg.workers.llm.backend != "vllm":
        raise ConfigError(f"layout {cfg.layout} places vLLM rollout workers: set workers.llm.backend=vllm")
    if spec.colocated and cfg.rollout.max_staleness:
        raise ConfigError(
            f"layout {cfg.layout}: its vLLM engines sleep through the update, so rollouts cannot run ahead: "
            "set rollout.max_staleness=0"
        )
    defaults = placement_defaults()
    for key, value in layout_values(spec).items():
        owner, name = _owner_of(cfg, key)
        current = getattr(owner, name)
        if current != value and current != defaults[key]:
            raise ConfigError(
                f"{key}={current}: layout {cfg.layout} sets it to {value}; drop the key, or set layout=custom"
            )
        setattr(owner, name, value)


def placement_defaults() -> dict[str, Any]:
    """The `PLACEMENT` keys' defaults (``workers.llm``'s: an `LLMConfig`'s)."""
    from types import SimpleNamespace

    from palaestra.shared.config import ClusterConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.rl.config import LearnerConfig, WorkersConfig

    workers = WorkersConfig(llm=LLMConfig())
    root = SimpleNamespace(llm=LLMConfig(), cluster=ClusterConfig(), learner=LearnerConfig(), workers=workers)
    return {key: getattr(*_owner_of(root, key)) for key in PLACEMENT}
