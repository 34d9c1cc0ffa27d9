"""GPU check of the NCCL weight sync to a vLLM rollout worker (``workers.weight_sync: nccl``).

    python tools/gpu_check_vllm_sync.py [--model tiny] [--gpu-memory-utilization 0.3] [--tokens 16]

Needs two CUDA GPUs, vLLM (the ``palaestra-shared[vllm]`` extra, 0.33.0) and Ray: one rollout worker (a Ray
actor holding a vLLM engine) on GPU 1, the trainer's side (this process, rank 0 of the NCCL group) on GPU 0
(NCCL refuses two ranks on one GPU). With greedy rollouts it checks that

1. weights B sent over NCCL (rollout/vllm_weight_sync.py, through vLLM's own weight-transfer engine) give
   the same rollouts as B loaded through the object store (`VLLMClient.load_weights`), and not A's;
2. the engine's own weights A sent back over NCCL give A's rollouts again;

and prints the seconds of one sync on each path and the bytes sent. B is A plus noise (0.1 of each tensor's
standard deviation). Exits 0 when both hold, 1 when not, 2 when this machine lacks what it needs.

Not run yet: no machine with two GPUs and vLLM was available when it was written.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import subprocess
import sys
import time


def gpu_count() -> int:
    """GPUs on this machine, without initializing CUDA here (the worker's GPU is chosen before that)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="a model name or HF directory (default: tiny)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per greedy rollout")
    args = parser.parse_args(argv)
    missing = [m for m in ("vllm", "ray") if importlib.util.find_spec(m) is None]
    if missing or gpu_count() < 2:
        print(f"gpu_check_vllm_sync: needs 2 CUDA GPUs, vLLM and Ray (GPUs: {gpu_count()}, missing: {missing})")
        return 2
    # Ray (started first) sees GPU 1 only, so its actor gets GPU 1; this process then takes GPU 0
    os.environ["CUDA_VISIBLE_DEVICES"] = "1"
    import ray

    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False)
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    import torch

    from palaestra.shared.llm import LLMConfig, make_client
    from palaestra.shared.rl.episodes import make_env
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
    from palaestra.shared.rollout.vllm_weight_sync import WeightSync, wire_params
    from palaestra.shared.rollout.workers import RayRollouts

    specs = [EpisodeSpec(functools.partial(make_env, "task", {}), seed=i, group_id=str(i)) for i in range(4)]
    cfg = RolloutConfig(group_size=1, max_tokens_per_turn=args.tokens, temperature=0.0)
    worker_llm = LLMConfig(backend="vllm", model=args.model, gpu_memory_utilization=args.gpu_memory_utilization)
    pool = RayRollouts(worker_llm, cfg, num_workers=1, num_cpus=1, num_gpus=1, weight_sync=WeightSync.nccl)

    def rollouts() -> list:
        return [t.turns[0].response_ids for t in pool.run(specs, seed=0).trajectories]

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    try:
        weights_a = make_client(LLMConfig(model=args.model, device="cuda")).model.state_dict()
        gen = torch.Generator(device="cuda").manual_seed(0)
        weights_b = {
            k: v + 0.1 * v.float().std() * torch.randn(v.shape, generator=gen, device=v.device, dtype=v.dtype)
            if v.is_floating_point() and v.numel() > 1
            else v
            for k, v in weights_a.items()
        }
        sent = sum(torch.Size(p.shape).numel() * p.dtype.itemsize for p in wire_params(weights_b, torch.bfloat16))
        tokens_a = rollouts()
        connect_s = timed(lambda: pool.sync(weights_b))  # forms the group, then the first sync
        nccl_s = timed(lambda: pool.sync(weights_b))
        tokens_b_nccl = rollouts()
        cpu_b = {k: v.detach().cpu() for k, v in weights_b.items()}
        store_s = timed(lambda: ray.get(pool.workers[0].load_weights.remote(ray.put(cpu_b))))
        tokens_b_store = rollouts()
        pool.sync(weights_a)
        tokens_a_again = rollouts()
    finally:
        pool.close()
        ray.shutdown()
    same_b = tokens_b_nccl == tokens_b_store
    moved = tokens_b_nccl != tokens_a
    back = tokens_a_again == tokens_a
    print(f"bytes per sync: {sent / 1e6:.1f} MB (bf16)")
    print(
        f"first NCCL sync (group formed): {connect_s:.3f} s; NCCL sync: {nccl_s:.3f} s ({sent / nccl_s / 1e9:.2f} GB/s)"
    )
    print(f"object store load of the same weights: {store_s:.3f} s")
    print(f"B over NCCL == B through the object store: {same_b}; differs from A: {moved}; A again: {back}")
    return 0 if same_b and moved and back else 1


if __name__ == "__main__":
    sys.exit(main())
