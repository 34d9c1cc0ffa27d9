"""The learner's weights to vLLM rollout workers over NCCL (``workers.weight_sync: nccl``), batched.

Runs on vLLM's own weight-transfer engine, ``vllm.distributed.weight_transfer`` (NCCL backend), in
0.32 (the CPU build) and 0.33 (the ``palaestra-shared[vllm]`` pin for GPUs); they differ in vLLM's
``WeightSource`` (0.32: ``metadata()`` and iteration; 0.33: a cached ``metadata`` property and
``iter_full()``; `build_weight_source` builds the one installed) and in what later syncs resend (0.33 sends names,
dtypes and shapes with the first sync only; 0.32 with every sync). On CPU (``cpu_transport``,
llm/vllm_cpu_transport.py) gloo takes NCCL's place and the whole protocol runs, vLLM's receiving side
and its layerwise reload included (shared/tests/test_vllm_weight_sync.py, on vLLM 0.32); the NCCL calls
themselves need GPUs: ``tools/gpu_check_vllm_sync.py`` is the check to run where two GPUs and vLLM are.

The default, ``object_store``, stays what rollout/workers.py does on CPU and with transformers
workers: the state dict goes into Ray's object store once and every worker loads it. LoRA policies on one
base (rl/policies.py) always sync that way, the adapters' tensors alone (megabytes), which each vLLM engine
reloads as LoRA adapters (llm/vllm_backend.py `VLLMClient.load_adapters`); ``nccl`` is refused for them.

One sync with ``nccl`` (vLLM's NCCL backend, the pattern of vLLM's RLHF examples, OpenRLHF and verl):

- Each vLLM engine is built with ``weight_transfer_config={"backend": "nccl"}``
  (llm/vllm_backend.py): each of its GPU workers then carries vLLM's `NCCLWeightTransferEngine`,
  idle until a trainer connects.
- Once, at the first sync (`NcclWeightSync.connect`): this process (the trainer's, which holds the
  weights) is rank 0 of a fresh NCCL group: vLLM's `StatelessProcessGroup` rendezvous on a TCP store
  at this host's address, then vLLM's `PyNcclCommunicator`. Rollout worker i's engine workers take
  ranks ``offset_i .. offset_i + n_i - 1`` (`group_ranks`, n_i = TP x PP of that engine). vLLM's own
  trainer engine gives every engine rank offset 1, which fits a single engine only; `VLLMWorkersClient`
  hands each engine its own offset, as OpenRLHF does (``i * tp + 1``).
- Every sync (`NcclWeightSync.send`): vLLM's `NCCLTrainerWeightTransferEngine.send_weights` calls
  ``start_weight_update`` on every engine, then ``update_weights`` (the engines wait inside NCCL)
  while this process broadcasts the weights packed into flat uint8 buckets of 1 GiB, two in flight
  (vLLM's ``packed_nccl_broadcast_producer``; each engine unpacks a bucket and hands its tensors to
  ``model.load_weights``, vLLM's own loader that shards and fuses HF names, under its layerwise
  reload), then ``finish_weight_update``, after which each engine drops its prefix cache (KV blocks
  computed with the old weights). Three RPC rounds per sync whatever the model's size, never one per
  parameter; names, dtypes and shapes travel with the first sync only on vLLM 0.33 (with each on 0.32).
- What is sent (`wire_params`, `wire_tensors`): the state dict in its own order (a decoder layer's
  tensors together, so vLLM's layerwise reload completes one layer before the next begins), each
  tensor once (an alias, such as the tied ``lm_head.weight`` of a tied-embedding model, is the tensor
  already sent under its first name; vLLM's loaders skip ``lm_head`` of tied models anyway), floating
  tensors cast to the engines' dtype (bf16 by default: half the bytes of the fp32 master weights) and
  moved to this process's GPU one tensor at a time.
- A rollout worker that dies is replaced (rollout/workers.py); the group is then torn down
  (``ncclCommAbort`` on every side) and formed again with the new worker, and the current weights
  are sent again.

Needs: this process on a GPU of its own (NCCL refuses two ranks on one GPU: with the learner and
vLLM sharing a GPU, keep ``object_store``) and reachable from the workers' nodes over TCP. A worker
that dies in the middle of a broadcast leaves it waiting: PyNccl has no timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

# torch is imported in the functions that compute: `WeightSync` and its check load without it (`palaestra show`)
if TYPE_CHECKING:
    import torch


class WeightSync(StrEnum):
    """How the rollout workers get the learner's weights after each step."""

    object_store = "object_store"
    nccl = "nccl"


def check_weight_sync(mode: WeightSync, workers: Any) -> str | None:
    """Config check of ``workers.weight_sync`` (`WorkersConfig`): nccl needs Ray workers running vLLM."""
    if mode != WeightSync.nccl:
        return None
    backend = workers.llm.backend if workers.llm is not None else None
    if backend != "vllm":
        return f"nccl needs vLLM rollout workers (workers.llm.backend=vllm, got {backend or 'the learner llm'})"
    if workers.num_workers < 1:
        return "nccl needs Ray rollout workers (workers.num_workers >= 1)"
    return None


@dataclass(frozen=True)
class WireParam:
    """One tensor as it travels: its state-dict name, wire dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def wire_params(state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> list[WireParam]:
    """What one sync sends, in the state dict's order: each tensor once under its first name, floating
    tensors in `dtype`, other tensors in their own."""
    import torch

    seen: set[tuple] = set()
    params = []
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        key = _alias_key(tensor)
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        wire = dtype if tensor.is_floating_point() else tensor.dtype
        params.append(WireParam(name, wire, tuple(tensor.shape)))
    return params


def _alias_key(tensor: torch.Tensor) -> tuple | None:
    """Equal for two views of the same elements (tied weights); None for an empty tensor (no storage)."""
    if tensor.numel() == 0:
        return None
    storage = tensor.untyped_storage()
    return (tensor.device, storage.data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))


def wire_tensors(
    state_dict: dict[str, torch.Tensor], params: list[WireParam], device: torch.device | str
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for each of `params`, cast and on `device`, one tensor at a time."""
    for p in params:
        tensor = state_dict.get(p.name)
        if tensor is None or tuple(tensor.shape) != p.shape:
            got = "missing" if tensor is None else f"shape {tuple(tensor.shape)}"
            raise ValueError(f"the weights to send no longer match the group's: {p.name!r} {p.shape} is {got}")
        yield p.name, tensor.detach().to(device=device, dtype=p.dtype).contiguous()


def group_ranks(engine_world_sizes: list[int]) -> tuple[list[int], int]:
    """The first rank of each engine in the trainer-to-engines NCCL group (rank 0: the trainer) and the
    group's size."""
    offsets, next_rank = [], 1
    for i, n in enumerate(engine_world_sizes):
        if n < 1:
            raise ValueError(f"vLLM engine {i} reports {n} GPU workers")
        offsets.append(next_rank)
        next_rank += n
    return offsets, next_rank


class VLLMWorkersClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol (four methods) over our rollout workers.

    A worker is a Ray actor handle with ``weight_transfer.remote(method, *args)`` (`RolloutWorker`),
    which calls that method of its `VLLMClient`; `get` waits for a list of their results (``ray.get``).
    Each call goes to every worker and waits for all of them.
    """

    def __init__(self, workers: list, get: Callable[[list], list]):
        self.workers, self.get = list(workers), get
        sizes = self._all("transfer_world_size")
        self.offsets, self.world_size = group_ranks(sizes)

    def _all(self, method: str, *args: Any) -> list:
        return self.get([w.weight_transfer.remote(method, *args) for w in self.workers])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """vLLM's worker init info with each engine's own ``rank_offset``."""
        if init_info.get("world_size") != self.world_size:
            raise ValueError(f"the group has {self.world_size} ranks; init info says {init_info.get('world_size')}")
        refs = [
            w.weight_transfer.remote("init_weight_transfer", {**init_info, "rank_offset": offset})
            for w, offset in zip(self.workers, self.offsets)
        ]
        self.get(refs)

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._all("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_update")

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer")

    def use_cpu_transport(self) -> None:
        """Gloo instead of NCCL in every engine (llm/vllm_cpu_transport.py)."""
        self._all("use_cpu_transport")


class NcclWeightSync:
    """The trainer's side: rank 0 of the NCCL group, sending a state dict to every vLLM rollout worker."""

    def __init__(
        self,
        workers: list,
        get: Callable[[list], list],
        dtype: torch.dtype | str,
        bucket_bytes: int | None = None,
        cpu_transport: bool = False,
    ):
        """`cpu_transport`: gloo in place of NCCL, here and in the engines (CPU tests and rehearsals)."""
        import torch

        self.workers, self.get, self.bucket_bytes = list(workers), get, bucket_bytes
        self.cpu_transport = cpu_transport
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # the engines' weights
        self.params: list[WireParam] | None = None
        self.state: dict[str, torch.Tensor] | None = None
        self.client: VLLMWorkersClient | None = None
        self.engine: Any = None  # vLLM's NCCLTrainerWeightTransferEngine once connected

    def send(self, state_dict: dict[str, torch.Tensor]) -> None:
        """One batched transfer of `state_dict` to every worker (connecting first if needed)."""
        import torch

        params = wire_params(state_dict, self.dtype)
        if self.params is not None and params != self.params:
            raise ValueError("the weights' names, dtypes or shapes changed since the NCCL group was formed")
        self.params, self.state = params, state_dict
        if self.engine is None:
            self.connect()
        device = self._device()
        if device.type == "cuda":  # vLLM packs on its own streams: the optimizer's writes must have landed
            torch.cuda.synchronize(device)
        self.engine.send_weights()

    def connect(self) -> None:
        """Form the NCCL group: this process is rank 0, each worker's engine joins at its offset."""
        import torch

        if not self.cpu_transport and not torch.cuda.is_available():
            raise RuntimeError(
                "workers.weight_sync=nccl sends from the trainer's process, which has no CUDA GPU; use object_store"
            )
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )
        from vllm.utils.network_utils import get_ip, get_open_port

        self.client = VLLMWorkersClient(self.workers, self.get)
        if self.cpu_transport:
            from palaestra.shared.llm.vllm_cpu_transport import install

            install()
            self.client.use_cpu_transport()
        sizes = {"packed_buffer_size_bytes": self.bucket_bytes} if self.bucket_bytes else {}  # else vLLM's 1 GiB
        info = NCCLTrainerInitInfo(
            master_address=get_ip(), master_port=get_open_port(), world_size=self.client.world_size, rank=0, **sizes
        )
        source = build_weight_source(self, self._device())
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=self.client, source=source)

    def reconnect(self, workers: list) -> None:
        """After a worker was replaced: a new group with `workers`, which then get the current weights."""
        self.close()
        self.workers = list(workers)
        if self.state is not None:
            self.send(self.state)

    def close(self) -> None:
        """Tear the group down on the workers (those alive) and here."""
        if self.client is not None:
            with contextlib.suppress(Exception):  # a dead worker: its side of the group is gone with it
                self.client.shutdown_weight_transfer_engine()
        if self.engine is not None:
            self.engine.shutdown()
        self.client = self.engine = None

    def _device(self) -> torch.device:
        import torch

        return torch.device("cpu") if self.cpu_transport else _sender_device()


def _sender_device() -> torch.device:
    """This process's current GPU: where vLLM's communicator is built, so where the tensors must be."""
    import torch

    return torch.device("cuda", torch.cuda.current_device())


def build_weight_source(sync: NcclWeightSync, device: torch.device) -> Any:
    """vLLM's ``WeightSource`` over ``sync``'s current state dict, in the installed vLLM's API (imported only
    here): 0.32 declares ``metadata()`` and ``__iter__``, 0.33 a cached ``metadata`` property and
    ``iter_full()``."""
    from functools import cached_property

    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    def metadata() -> list[ParamMeta]:
        assert sync.params is not None
        return [ParamMeta(p.name, p.dtype, p.shape) for p in sync.params]

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        assert sync.state is not None and sync.params is not None
        return wire_tensors(sync.state, sync.params, device)

    if "__iter__" in WeightSource.__abstractmethods__:  # vLLM 0.32

        class IterableStateDictSource(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                return metadata()

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                return tensors()

        return IterableStateDictSource()

    class StateDictSource(WeightSource):  # vLLM 0.33
        @cached_property
        def metadata(self) -> list[ParamMeta]:
            return metadata()

        def iter_full(self) -> Iterator[tuple[str, torch.Tensor]]:
            return tensors()

    return StateDictSource()
