"""One rank of the sharded learner (a Ray actor); rl/distributed.py explains the whole and starts the ranks.

`LogProbs` is the root module that FSDP2 / DDP wrap; `LearnerRank` holds the
rank's shard (or replica) of the policy, its AdamW state and the frozen
reference, joins the process group, scores rows and runs one optimizer step
over its share of a minibatch through the learner's one inner loop
(rl/update.py) with `RankCollectives` (all-reduces: the global normalizer and
micro-batch count, the agreed stop on a non-finite loss, the metrics), gathers
the full state dict, and writes / reads checkpoints.
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path
from typing import Any

import torch

from palaestra.shared.rl.batch import TrainBatch
from palaestra.shared.rl.config import TrainConfig, learner_dtypes
from palaestra.shared.rl.learner import release_memory, scoring_temperature
from palaestra.shared.rl.logprobs import token_logprobs_and_entropy
from palaestra.shared.rl.optim import make_optimizer, set_learning_rate
from palaestra.shared.rl.policy import reference_dtype
from palaestra.shared.rl.update import Collectives, Forward, StepData, minibatch_step, score_rows


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
        cfg: TrainConfig,
        initial_state: dict | None,
        reference: bool,
        reference_dir: str | None,
    ) -> int:
        import torch.distributed as dist
        from transformers import AutoModelForCausalLM

        from palaestra.shared.llm.models import resolve_model_path

        llm, learner = cfg.llm, cfg.learner
        self.cuda = learner.num_gpus > 0
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        dist.init_process_group(
            "nccl" if self.cuda else "gloo",
            init_method=f"tcp://{master[0]}:{master[1]}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(minutes=30),
        )
        self.strategy = learner.strategy
        self.bf16 = learner_dtypes(learner, llm, self.device.type) == "bfloat16"
        self.compute = torch.bfloat16 if self.bf16 else torch.float32
        path = resolve_model_path(llm.model, seed=llm.seed)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if initial_state is not None:
            model.load_state_dict(initial_state)
        ref = None
        if reference:
            # in the compute dtype (rl/policy.py `reference_dtype`): bf16 with bf16 compute, as the trainer's copy
            ref = AutoModelForCausalLM.from_pretrained(reference_dir or path, dtype=reference_dtype(self.compute))
            if initial_state is not None and reference_dir is None:
                ref.load_state_dict(initial_state)
            ref.requires_grad_(False).eval()
        if learner.gradient_checkpointing:
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
        self.optimizer = make_optimizer(self.root.parameters(), cfg.optim)
        if self.cuda:  # the whole models moved here before sharding: their blocks back, for a colocated vLLM engine
            torch.cuda.empty_cache()
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

    def _forward(self, model: torch.nn.Module, temperature: float) -> Forward:
        def forward(rows: TrainBatch, with_entropy: bool):
            ids, mask = rows.input_ids.to(self.device), rows.attention_mask.to(self.device)
            positions = rows.loss_mask.to(self.device) > 0  # the output head runs on the model's tokens only
            with self._autocast():
                return model(ids, mask, temperature, with_entropy, positions)

        return forward

    def score(
        self, batch: TrainBatch, idx: torch.Tensor, cfg: TrainConfig, with_entropy: bool, ref: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the rows `idx` under the policy (or the reference), (len(idx), L-1)."""
        model = self.ref if ref else self.engine
        if model is None:
            raise ValueError("no reference model on the learner ranks (loss.kl_coef is 0)")
        model.eval()
        forward = self._forward(model, scoring_temperature(cfg))
        tokens = cfg.learner.micro_batch_tokens
        logps, ents = score_rows(forward, batch, idx, tokens, 0, with_entropy, RankCollectives(self, model))
        return logps[idx], (None if ents is None else ents[idx])

    def optimizer_step(self, data: StepData, idx: torch.Tensor, cfg: TrainConfig, lr: float | None) -> dict[str, float]:
        """One optimizer step over this rank's rows `idx` of the minibatch (see the module docstring)."""
        if lr is not None:
            self.set_learning_rate(lr)
        self.engine.train()
        forward = self._forward(self.engine, scoring_temperature(cfg))
        params = list(self.root.parameters())
        tokens, max_norm = cfg.learner.micro_batch_tokens, cfg.optim.max_grad_norm
        collectives = RankCollectives(self, self.engine)
        return minibatch_step(
            forward, data, idx, self.optimizer, params, cfg.loss, tokens, max_norm, self.device, collectives
        )

    def set_learning_rate(self, lr: float) -> None:
        set_learning_rate(self.optimizer, lr)

    def release_memory(self) -> None:
        """The update's gradients and cached GPU blocks back (colocated layouts: rl/learner.py `release_memory`)."""
        release_memory(self.optimizer, self.device)

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


class RankCollectives(Collectives):
    """The inner loop's hooks on a rank: all-reduces over the process group, and a zero pass through `engine`
    (the module the loop runs: the policy or the reference) for a micro-batch this rank does not have."""

    def __init__(self, rank: LearnerRank, engine: torch.nn.Module):
        self.rank, self.engine, self.world_size = rank, engine, rank.world_size

    def _all_reduce(self, values: list[float], op) -> list[float]:
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.rank.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def max(self, value: int) -> int:
        from torch.distributed import ReduceOp

        return int(self._all_reduce([value], ReduceOp.MAX)[0])

    def sum(self, values: list[float]) -> list[float]:
        from torch.distributed import ReduceOp

        return self._all_reduce(values, ReduceOp.SUM)

    def all_finite(self, finite: bool) -> bool:
        from torch.distributed import ReduceOp

        return bool(self._all_reduce([float(finite)], ReduceOp.MIN)[0])

    def idle_pass(self) -> torch.Tensor:
        """A pass through the engine that moves nothing (its loss is 0 x the log-probs)."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.rank.device)
        with self.rank._autocast():
            return self.engine(ids, torch.ones_like(ids), 1.0, False)[0].sum() * 0.0
