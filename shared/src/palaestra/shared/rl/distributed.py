"""The sharded learner: ``learner.world_size`` Ray actors forming one torch.distributed group (FSDP2 or DDP).

The trainer's driver keeps the loop (rollout -> scoring -> advantages ->
updates -> weight sync); `DistributedLearner` is the learner half of it (the
face of rl/learner.py's `Learner`, as `LocalLearner` in process), on N
`LearnerRank` actors placed by one Ray placement group, as verl, OpenRLHF and
ROLL place theirs (DESIGN.md §6). ``learner.world_size`` 1 never comes here:
the model then lives in the trainer's own process.

Several policies (rl/policies.py): each policy with ``learner.world_size`` > 1
has a `DistributedLearner` of its own, built from its config (its optimizer and
learner settings): its placement group, its ranks (separate actor processes, so
each group is its ranks' default process group and no two share one), its
reference and its checkpoint shards (under its policy's subdirectory). The
trainer starts them one after another, so each group's rank 0 already listens
on its rendezvous port when the next group's rank 0 picks a free one. The
cluster must hold every policy's ranks at once (policies x world size x
``learner.num_cpus`` / ``num_gpus``).

- Process group: gloo on CPU, NCCL on GPU (``learner.num_gpus`` > 0; Ray gives
  each rank its own GPU, ``cuda:0`` inside the actor). Rank 0 publishes its
  address and a free port; every rank joins with ``init_method=tcp://``.
- Sharding: ``fsdp`` applies FSDP2 ``fully_shard`` to every module whose class
  is in the model's ``_no_split_modules`` (the decoder layers), then to the root;
  with bf16 compute (``learner.compute_dtype``, the default on GPU) through a
  `MixedPrecisionPolicy` (fp32 gradient reduction, fp32 master weights).
  ``ddp`` keeps a full replica per rank (`DistributedDataParallel`; bf16 under
  autocast).
- Data: each step's tensors (`update.StepData`) go into the object store once (`ray.put`); a
  minibatch's rows are cut into one contiguous, equal share per rank (sizes
  differ by at most one row). A rank splits its share into micro-batches
  (`batch.micro_batches`, ``learner.micro_batch_tokens``); ranks with fewer
  micro-batches run zero-loss passes, so every rank issues the same
  collectives.
- Normalization: each rank's `loss_normalizer` (rows, tokens, or rows x
  max_len) is all-reduced; every micro-batch's loss is divided by the global sum
  over the world size, because DDP and FSDP average gradients across ranks:
  the averaged gradient is then exactly the single-process gradient of the
  whole minibatch. A non-finite loss on any rank is agreed by an all-reduce
  before the backward, so all ranks stop together.
- Clipping: the global gradient norm (FSDP2: the norm of the sharded DTensor
  gradients, completed with ``full_tensor``, as verl's ``fsdp2_clip_grad_norm_``).
- Weights out: `state_dict` gathers the full HF state dict on rank 0
  (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``); the
  trainer hands it to the rollout workers in one object-store transfer. vLLM
  workers get it the same way (`VLLMClient.load_weights`), or, with
  ``workers.weight_sync: nccl``, in one NCCL broadcast from the trainer's GPU
  through vLLM's own weight-transfer engine (rollout/vllm_weight_sync.py).
- Checkpoints: rank 0 writes the gathered weights with ``save_pretrained``
  (given a copy: transformers 5.20 empties the dict it is given); every rank
  writes its shard of weights and AdamW state with torch.distributed.checkpoint
  under ``sharded/``; `load` restores both, so a resumed run continues exactly.
  Several nodes need ``output_dir`` on a shared filesystem.

The ranks themselves are in rl/distributed_rank.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from palaestra.shared.rl.batch import TrainBatch
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.distributed_rank import LearnerRank
from palaestra.shared.rl.learner import ppo_update, releases_memory
from palaestra.shared.rl.update import StepData


class DistributedLearner:
    """The driver's handle on the N learner ranks (the `learner.Learner` face); every call runs on all ranks
    and returns rank 0's answer. ``cfg`` (the run's `TrainConfig`; with a ``policies`` section its policy's,
    `policy_config`) travels with each call: what the ranks compute is what it says at that call. ``mirror``:
    a model in the driver's process that every `update` refreshes with the ranks' new weights (the trainer's
    copy, which the rollouts and checkpoints read). ``name``: whose ranks these are, for messages (a policy's,
    with several)."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        initial_state: dict | None = None,
        reference: bool = False,
        reference_dir: str | None = None,
        mirror: torch.nn.Module | None = None,
        placement_timeout_s: float = 120.0,
        name: str = "the learner",
    ):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from palaestra.shared import cluster as ray_cluster

        learner = cfg.learner
        if learner.world_size < 2:
            raise ValueError(f"a distributed learner needs learner.world_size >= 2, got {learner.world_size}")
        self.cfg, self.mirror = cfg, mirror
        self.ray = ray_cluster.init(cfg.cluster, in_process="learner.world_size=1")
        self.world_size = learner.world_size
        bundle = {"CPU": learner.num_cpus, **({"GPU": learner.num_gpus} if learner.num_gpus else {})}
        self.group = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
        try:
            self.ray.get(self.group.ready(), timeout=placement_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            raise RuntimeError(
                f"{name}'s {self.world_size} ranks x {bundle} could not be placed within "
                f"{placement_timeout_s:g} s; the cluster has {self.ray.cluster_resources()} in all "
                "(rollout workers and other policies' learners hold theirs too): raise cluster.num_cpus / num_gpus "
                "or lower learner.num_cpus"
            ) from None
        actor = self.ray.remote(num_cpus=learner.num_cpus, num_gpus=learner.num_gpus)(LearnerRank)
        threads = max(1, int(learner.num_cpus))
        self.ranks = [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i)
            ).remote(i, self.world_size, threads)
            for i in range(self.world_size)
        ]
        master = self.ray.get(self.ranks[0].address.remote())
        state_ref = self.ray.put(initial_state) if initial_state is not None else None
        self._all(lambda r: r.setup.remote(master, cfg, state_ref, reference, reference_dir))
        self._refs: dict[str, tuple[Any, Any]] = {}

    def _all(self, call) -> list:
        return self.ray.get([call(r) for r in self.ranks])

    def _put(self, name: str, value: Any):
        """One object-store copy per distinct value (a step's batch and tensors travel once, not per call)."""
        held = self._refs.get(name)
        if held is None or not _same(held[0], value):
            self._refs[name] = (value, self.ray.put(value))
        return self._refs[name][1]

    def score(
        self, batch: TrainBatch, *, with_entropy: bool = True, ref: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of every row under the policy (``ref``: the reference), (N, L-1)."""
        batch_ref = self._put("batch", batch)
        parts = shares(torch.arange(len(batch)), self.world_size)
        cfg = self.cfg
        results = self._all_indexed(lambda r, i: r.score.remote(batch_ref, parts[i], cfg, with_entropy, ref))
        logps = torch.zeros(batch.loss_mask.shape)
        ents = torch.zeros(batch.loss_mask.shape) if with_entropy else None
        for part, (lp, ent) in zip(parts, results):
            logps[part] = lp
            if ents is not None:
                ents[part] = ent
        return logps, ents

    def optimizer_step(self, data: StepData, idx: torch.Tensor, lr: float | None = None) -> dict[str, float]:
        """One optimizer step over the minibatch rows `idx`, each rank on its contiguous share (at `lr` when given)."""
        data_ref = self._put("step", data)
        parts = shares(idx, self.world_size)
        cfg = self.cfg
        return self._all_indexed(lambda r, i: r.optimizer_step.remote(data_ref, parts[i], cfg, lr))[0]

    def update(self, data: StepData) -> dict[str, float]:
        """The RL step's PPO epochs x minibatches on the ranks (`learner.ppo_update`), then the mirror refreshed."""
        metrics = ppo_update(self, data)
        if releases_memory(self.cfg):  # colocated with sleeping vLLM engines: their memory back (rl/learner.py)
            self._all(lambda r: r.release_memory.remote())
        if self.mirror is not None:  # the ranks' new weights, gathered once, into the driver's copy
            self.mirror.load_state_dict(self.state_dict())
        return metrics

    def _all_indexed(self, call) -> list:
        return self.ray.get([call(r, i) for i, r in enumerate(self.ranks)])

    def set_learning_rate(self, lr: float) -> None:
        """Every rank's AdamW updates at `lr` from now on (the trainer sets it once per RL step)."""
        self._all(lambda r: r.set_learning_rate.remote(lr))

    def full_gradients(self) -> dict[str, torch.Tensor]:
        return self._all(lambda r: r.full_gradients.remote())[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF state dict, gathered on rank 0 and fetched once."""
        return self._all(lambda r: r.state_dict.remote())[0]

    def save(self, path: str | Path) -> None:
        self._all(lambda r: r.save.remote(str(path)))

    def load(self, path: str | Path) -> None:
        if not (Path(path) / "sharded").is_dir():
            raise FileNotFoundError(f"{path} has no sharded learner checkpoint (sharded/)")
        self._all(lambda r: r.load.remote(str(path)))

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if not self.ranks:
            return
        try:
            self._all(lambda r: r.shutdown.remote())
        finally:
            for r in self.ranks:
                self.ray.kill(r)
            remove_placement_group(self.group)
            self.ranks, self._refs = [], {}


def _same(held: Any, value: Any) -> bool:
    """The same object (a `StepData`: the same tensors, the same step)."""
    if isinstance(held, StepData) and isinstance(value, StepData):
        fields = [(getattr(held, f), getattr(value, f)) for f in StepData.__dataclass_fields__]
        return all(a is b if isinstance(a, torch.Tensor | TrainBatch) else a == b for a, b in fields)
    return held is value


def shares(idx: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """`idx` cut into `world_size` contiguous shares whose sizes differ by at most one."""
    return list(torch.tensor_split(idx, world_size))
