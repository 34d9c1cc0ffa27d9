"""One rank of the sharded learner (a Ray actor); rl/distributed.py explains the whole and starts the ranks.

`LogProbs` is the root module that FSDP2 / DDP wrap; `LearnerRank` holds the
rank's shard (or replica) of the policy, its AdamW state and the frozen
reference, joins the process group, scores rows, runs one optimizer step over
its share of a minibatch with the globally normalized loss, clips with the
global norm, gathers the full state dict, and writes / reads checkpoints.
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path
from typing import Any

import torch

from palaestra.shared.llm.base import LLMConfig
from palaestra.shared.rl.batch import TrainBatch, micro_batches
from palaestra.shared.rl.config import LearnerConfig, OptimConfig, learner_dtypes
from palaestra.shared.rl.loss import LossConfig, loss_normalizer, policy_loss, token_logprobs_and_entropy
from palaestra.shared.rl.optim import make_optimizer, set_learning_rate
from palaestra.shared.rl.update import TOKEN_MEANS

STRATEGIES = ("fsdp", "ddp")


class LogProbs(torch.nn.Module):
    """The root that FSDP2 / DDP wrap: its forward is `token_logprobs_and_entropy` over the HF model
    (at ``positions``, sharing prompts when ``shared_prompt``).

    The chunked log-probs call the decoder and the output head separately; run inside the root's
    forward, FSDP2's root hooks gather the root's parameters (embeddings, head) around both, and DDP
    prepares its gradient reduction.
    """

    def __init__(self, model, shared_prompt: bool = False):
        super().__init__()
        self.model, self.shared_prompt = model, shared_prompt

    def forward(self, input_ids, attention_mask, temperature: float, with_entropy: bool, positions=None):
        return token_logprobs_and_entropy(
            self.model,
            input_ids,
            attention_mask,
            temperature,
            with_entropy,
            positions=positions,
            shared_prompt=self.shared_prompt and positions is not None,
        )


class LearnerRank:
    """One rank of the learner (a Ray actor): a shard or replica of the policy, its optimizer, the reference."""

    def __init__(self, rank: int, world_size: int, torch_threads: int = 1):
        torch.set_num_threads(torch_threads)
        self.rank, self.world_size = rank, world_size

    def address(self) -> tuple[str, int]:
        """This node's address and a free port (rank 0 hosts the rendezvous)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def setup(
        self,
        master: tuple[str, int],
        llm: LLMConfig,
        learner: LearnerConfig,
        optim: OptimConfig,
        initial_state: dict | None,
        reference: bool,
        reference_dir: str | None,
        gradient_checkpointing: bool,
    ) -> int:
        import torch.distributed as dist
        from transformers import AutoModelForCausalLM

        from palaestra.shared.llm.models import resolve_model_path

        self.cuda = learner.num_gpus > 0
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        dist.init_process_group(
            "nccl" if self.cuda else "gloo",
            init_method=f"tcp://{master[0]}:{master[1]}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(minutes=30),
        )
        self.strategy, self.optim_cfg = learner.strategy, optim
        self.bf16 = learner_dtypes(learner, llm, self.device.type) == "bfloat16"
        path = resolve_model_path(llm.model, seed=llm.seed)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if initial_state is not None:
            model.load_state_dict(initial_state)
        ref = None
        if reference:
            ref = AutoModelForCausalLM.from_pretrained(reference_dir or path, dtype=torch.float32)
            if initial_state is not None and reference_dir is None:
                ref.load_state_dict(initial_state)
            ref.requires_grad_(False).eval()
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model.to(self.device)  # the HF model (its names are the checkpoint's)
        # FSDP2 gathers a layer's shard for each call of it, so all ranks must make the same decoder calls;
        # whether a micro-batch shares a prompt is decided per rank: only DDP shares
        shared = learner.shared_prompt and self.strategy == "ddp"
        self.root = self._shard(LogProbs(self.model, shared))
        self.engine: torch.nn.Module = self.root
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            self.engine = DistributedDataParallel(self.root, device_ids=[0] if self.cuda else None)
        self.ref = self._shard(LogProbs(ref.to(self.device), shared)) if ref is not None else None
        self.optimizer = make_optimizer(self.root.parameters(), optim)
        return sum(p.numel() for p in self.model.parameters())

    def _shard(self, root: LogProbs) -> LogProbs:
        if self.strategy != "fsdp":
            return root
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kwargs: dict[str, Any] = {}
        if self.bf16:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        layer_classes = set(getattr(root.model, "_no_split_modules", None) or [])
        layers = [m for m in root.modules() if type(m).__name__ in layer_classes]
        if not layers:
            raise ValueError(f"{type(root.model).__name__} names no decoder layer class in _no_split_modules")
        for layer in layers:
            fully_shard(layer, **kwargs)
        fully_shard(root, **kwargs)
        return root

    def _autocast(self):
        enabled = self.bf16 and self.strategy == "ddp"  # FSDP2 casts through its MixedPrecisionPolicy
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled)

    def _all_reduce(self, values: list[float], op) -> list[float]:
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def _zero_loss(self, engine) -> torch.Tensor:
        """A pass that moves nothing but issues the same collectives as a real micro-batch."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        return engine(ids, torch.ones_like(ids), 1.0, False)[0].sum() * 0.0

    @torch.no_grad()
    def score(
        self, batch: TrainBatch, idx: torch.Tensor, temperature: float, max_tokens: int, with_entropy: bool, ref: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the rows `idx` under the policy (or the reference), (len(idx), L-1)."""
        from torch.distributed import ReduceOp

        model = self.ref if ref else self.engine
        if model is None:
            raise ValueError("no reference model on the learner ranks (loss.kl_coef is 0)")
        model.eval()
        parts = micro_batches(batch, idx, max_tokens) if len(idx) else []
        (count,) = self._all_reduce([len(parts)], ReduceOp.MAX)
        width = batch.loss_mask.shape[1]
        logps = torch.zeros((len(batch), width))
        ents = torch.zeros((len(batch), width)) if with_entropy else None
        for k in range(int(count)):
            with self._autocast():
                if k >= len(parts):
                    self._zero_loss(model)
                    continue
                rows = batch.rows(parts[k])
                ids, mask = rows.input_ids.to(self.device), rows.attention_mask.to(self.device)
                lp, ent = model(ids, mask, temperature, with_entropy, rows.loss_mask.to(self.device) > 0)
            logps[parts[k], : lp.shape[1]] = lp.float().cpu()
            if ents is not None and ent is not None:
                ents[parts[k], : ent.shape[1]] = ent.float().cpu()
        return logps[idx], (None if ents is None else ents[idx])

    def update(
        self,
        data: dict,
        idx: torch.Tensor,
        cfg: LossConfig,
        temperature: float,
        micro_batch_tokens: int,
    ) -> dict[str, float]:
        """One optimizer step over this rank's rows `idx` of the minibatch (see the module docstring)."""
        from torch.distributed import ReduceOp

        batch: TrainBatch = data["batch"]
        self.engine.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts = micro_batches(batch, idx, micro_batch_tokens) if len(idx) else []
        local = loss_normalizer(batch.loss_mask[idx], cfg) if len(idx) else 0.0
        total, _ = self._all_reduce([local, 0.0], ReduceOp.SUM)
        (count,) = self._all_reduce([len(parts)], ReduceOp.MAX)
        normalizer = total / self.world_size  # gradients are averaged over ranks: scale each rank's loss by N
        sums = dict.fromkeys(("loss", "tokens", *TOKEN_MEANS), 0.0)
        for k in range(int(count)):
            with self._autocast():
                if k < len(parts):
                    rows = batch.rows(parts[k])
                    cut = {name: _cut(data.get(name), parts[k], rows, self.device) for name in _STEP_TENSORS}
                    with_entropy = cut["entropies"] is None
                    logps, ent = self.engine(
                        rows.input_ids.to(self.device),
                        rows.attention_mask.to(self.device),
                        temperature,
                        with_entropy,
                        rows.loss_mask.to(self.device) > 0,  # the output head runs on the model's tokens only
                    )
                    loss, m = policy_loss(
                        logps,
                        logps.detach() if cut["old_logps"] is None else cut["old_logps"],  # on-policy: ratio 1
                        cut["advantages"],  # type: ignore[arg-type]
                        rows.loss_mask.to(self.device),
                        cfg,
                        ref_logps=cut["ref_logps"],
                        entropies=ent if with_entropy else cut["entropies"],
                        normalizer=normalizer,
                    )
                    tokens = float(rows.loss_mask.sum())
                else:
                    loss, m, tokens = self._zero_loss(self.engine), {}, 0.0
            (finite,) = self._all_reduce([float(torch.isfinite(loss).item())], ReduceOp.MIN)
            if not finite:
                return {"loss": float("nan"), "tokens": sums["tokens"]}
            loss.backward()
            sums["loss"] += float(loss.item())
            sums["tokens"] += tokens
            for name in TOKEN_MEANS:
                sums[name] += m.get(name, 0.0) * tokens
        if self.optim_cfg.max_grad_norm:
            grad_norm = self._clip(self.optim_cfg.max_grad_norm)
        self.optimizer.step()
        keys = list(sums)
        reduced = dict(zip(keys, self._all_reduce([sums[k] for k in keys], ReduceOp.SUM)))
        out = {"loss": reduced["loss"] / self.world_size, "tokens": reduced["tokens"]}
        out.update({k: reduced[k] / max(reduced["tokens"], 1.0) for k in TOKEN_MEANS})
        if self.optim_cfg.max_grad_norm:
            out["grad_norm"] = grad_norm
        return out

    def _clip(self, max_norm: float) -> float:
        from torch.distributed.tensor import DTensor

        params = [p for p in self.root.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
        if isinstance(total, DTensor):
            total = total.full_tensor()  # sum of the shards' squares across ranks
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    def set_learning_rate(self, lr: float) -> None:
        set_learning_rate(self.optimizer, lr)

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """The last update's gradient, whole, on CPU (a check of the sharded arithmetic)."""
        out = {}
        for name, p in self.root.named_parameters():
            if p.grad is not None:
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                out[name.removeprefix("model.")] = g.detach().float().cpu()
        return out if self.rank == 0 else {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF state dict on rank 0 ({} on the others); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(self.root, options=options)
        if self.rank != 0:
            return {}
        return {k.removeprefix("model."): v for k, v in full.items() if isinstance(v, torch.Tensor)}

    def save(self, path: str) -> None:
        """Rank 0: HF weights (``save_pretrained``); every rank: its shard of weights + optimizer under sharded/."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        full = self.state_dict()
        if self.rank == 0:
            self.model.save_pretrained(path, state_dict=dict(full))  # a copy: transformers empties the dict
        model_sd, optim_sd = get_state_dict(self.root, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(path) / "sharded"))

    def load(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        self._init_optimizer_state()
        model_sd, optim_sd = get_state_dict(self.root, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(Path(path) / "sharded"))  # fills the state dicts in place
        set_state_dict(self.root, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def _init_optimizer_state(self) -> None:
        """Give AdamW its (lazily created) moments, so the checkpoint's have somewhere to load into:
        one step on zero gradients at learning rate 0 (no parameter moves)."""
        if self.optimizer.state:
            return
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        self.optimizer.step()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


_STEP_TENSORS = ("old_logps", "advantages", "ref_logps", "entropies")


def _cut(x: torch.Tensor | None, part: torch.Tensor, rows: TrainBatch, device) -> torch.Tensor | None:
    return None if x is None else x[part, : rows.loss_mask.shape[1]].to(device)
