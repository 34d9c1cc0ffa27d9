"""Gloo in place of NCCL under vLLM's weight transfer, for CPU processes (tests and CPU rehearsals of
``workers.weight_sync: nccl``).

vLLM's NCCL weight-transfer engines (the trainer's `NCCLTrainerWeightTransferEngine` and each worker's
`NCCLWeightTransferEngine`, in 0.32 and 0.33 alike) open their communicator through one function,
``vllm.distributed.weight_transfer.nccl_common.stateless_init_process_group(address, port, rank,
world_size, device)``, and call two of its methods: ``broadcast(tensor, src, stream=None)`` and
``destroy()``. `install` replaces that function, in the calling process, with one that returns a
`GlooBroadcast` (a gloo process group of its own, over a TCP store at the same address and port, rank 0
hosting it). Without an accelerator it also makes the CUDA streams of vLLM's packed broadcast no-ops and
gives ``torch.accelerator`` a device index of 0 and a no-op ``synchronize``: what vLLM calls around a
broadcast. Everything else is vLLM's own code, unchanged: the handshake and its RPC rounds, each worker's
rank (its ``rank_offset`` plus its rank in its engine), the cutting of the weights into buckets, the
unpacking, and the layerwise reload into the model. Only the NCCL calls themselves are left to a GPU.
Checked with vLLM 0.32 (the CPU build; 0.33's receiving side also chains CUDA events between buckets,
which exist on GPU builds only).

Call it in the trainer's process and in every vLLM worker (`WeightLoaderExtension.palaestra_cpu_transport`,
``NcclWeightSync(..., cpu_transport=True)``); every rank of one group must use the same transport.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

TIMEOUT = timedelta(minutes=5)


class GlooBroadcast:
    """The two methods of vLLM's `PyNcclCommunicator` that its weight transfer uses, over gloo."""

    def __init__(self, address: str, port: int, rank: int, world_size: int, timeout: timedelta = TIMEOUT):
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        self.store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
        prefixed = dist.PrefixStore("palaestra-weight-transfer", self.store)
        self.group: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor, src: int, stream: object = None) -> None:
        import torch.distributed as dist

        if self.group is None:
            raise RuntimeError("the weight-transfer group was destroyed")
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.group.broadcast([tensor], options).wait()

    def destroy(self) -> None:
        self.group = None


class _NoStream:
    """Stands for a CUDA stream in vLLM's packed broadcast: nothing to wait for on CPU."""

    def synchronize(self) -> None:
        pass


def _gloo_group(address: str, port: int, rank: int, world_size: int, device: object = None) -> GlooBroadcast:
    return GlooBroadcast(address, port, rank, world_size)


def install() -> None:
    """Swap NCCL for gloo in vLLM's weight transfer, in this process (see the module docstring)."""
    import vllm.distributed.weight_transfer.nccl_common as nccl_common
    import vllm.distributed.weight_transfer.packed_tensor as packed_tensor

    nccl_common.stateless_init_process_group = _gloo_group  # type: ignore[assignment]
    if torch.accelerator.is_available():
        return
    packed_tensor._get_streams = lambda device, n: tuple(_NoStream() for _ in range(n))  # type: ignore[assignment]
    torch.accelerator.current_device_index = lambda: 0  # type: ignore[assignment]
    torch.accelerator.synchronize = lambda device=None: None  # type: ignore[assignment]
