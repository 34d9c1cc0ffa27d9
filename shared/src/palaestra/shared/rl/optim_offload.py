"""AdamW with its state in CPU memory (``learner.optimizer_offload``, the ``gpu1_offload`` layout): the in-process
learner's float32 weights and gradients stay on the GPU, AdamW's two float32 moments (8 bytes per parameter, 32 GB
for a 4B model) never go there. ZeRO-Offload's idea in one process.

Each step copies every weight and its gradient into CPU scratch tensors, runs `torch.optim.AdamW`'s own step on
them, and copies the weights back: the GPU weights stay the master copy (a checkpoint or `load_state_dict` of the
model needs no resync), and the state dict is AdamW's over the same parameter order, so checkpoints are
interchangeable with the plain optimizer's. On CPU the steps equal plain AdamW's bit for bit (tested); on a GPU
they differ by the two kernels' rounding. The price is two host transfers of the weights and one of the gradients
per optimizer step, and AdamW's arithmetic on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from palaestra.shared.rl.config import OptimConfig


class OffloadedAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` over CPU scratch copies of `params` (see the module docstring)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], optim: OptimConfig):
        self.targets = list(params)
        pin = torch.cuda.is_available() and any(p.device.type == "cuda" for p in self.targets)
        scratch = []
        for p in self.targets:
            c = torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin)
            scratch.append(torch.nn.Parameter(c.copy_(p.detach()), requires_grad=True))
        betas = (float(optim.betas[0]), float(optim.betas[1]))
        super().__init__(scratch, lr=optim.lr, betas=betas, weight_decay=optim.weight_decay)
        self.scratch = scratch

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("OffloadedAdamW takes no closure")
        for p, c in zip(self.targets, self.scratch):
            c.copy_(p.detach(), non_blocking=True)  # the GPU weights are the master copy
            if p.grad is None:
                c.grad = None
            else:
                if c.grad is None:
                    c.grad = torch.empty_like(c)
                c.grad.copy_(p.grad, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the copies into pinned memory are asynchronous
        super().step()
        for p, c in zip(self.targets, self.scratch):
            p.copy_(c, non_blocking=True)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The GPU gradients (what backward fills), and the scratch ones."""
        for p in (*self.targets, *self.scratch):
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()


def optimizer_for(params: Iterable[torch.nn.Parameter], optim: OptimConfig, offload: bool) -> torch.optim.AdamW:
    """The learner's AdamW (rl/optim.py `make_optimizer`), its state in CPU memory with `offload`."""
    from palaestra.shared.rl.optim import make_optimizer

    return OffloadedAdamW(params, optim) if offload else make_optimizer(params, optim)
