"""The paper-config step of tools/gpu_check.py: one training step of a paper config in its one-GPU layout.

    python tools/gpu_check.py --paper-step experiments/mars/qwen3_4b.yaml [--plan-only]

It resolves the config with ``layout=gpu1_colocated`` (rl/layout.py: the learner in this process and one vLLM
engine on the same GPU, sleeping through the update) and a one-step budget (`ONE_STEP`), prints `palaestra plan`'s
report at this GPU's memory, then runs the job for that one step (its model, data and Ray as the config names
them: Qwen3-4B needs a 141 GB GPU in this layout, an H200). ``--plan-only`` stops after the plan: what runs
without a GPU (the CPU-side parse and plan). Without CUDA the step says so and is skipped (exit status 2).

Written against vLLM 0.32's sleep mode, untested without a GPU (none was lent when it was written).
"""

from __future__ import annotations

ONE_STEP = (
    "layout=gpu1_colocated",
    "steps=1",
    "epochs=0",
    "tasks_per_step=4",
    "minibatch_size=0",
    "eval_before=false",
    "checkpoint_every=0",
    "output_dir=outputs/gpu_check/paper_step",
)
"""Overrides that make a paper config one short step on one GPU (its own settings otherwise)."""


def paper_step(config: str, plan_only: bool = False) -> int:
    """0 when the step ran (or, `plan_only`, the plan was printed); 2 when it was skipped or did not fit."""
    from palaestra.shared.jobs import load_config
    from palaestra.shared.plan import plan_config

    overrides = list(ONE_STEP)
    if "egpo" in config:  # epochs apply to egpo's epoch sampling only
        overrides.append("task_sampling=replacement")
    cfg = load_config(config, overrides)
    import torch

    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9 if torch.cuda.is_available() else 141.0
    report, fits = plan_config(cfg, gpu_gb=gpu_gb, gpus=1)
    print(report)
    if plan_only:
        return 0
    if not torch.cuda.is_available():
        print("gpu_check --paper-step: skipped, no CUDA GPU here (torch.cuda.is_available() is False)")
        return 2
    if not fits:
        print(f"gpu_check --paper-step: skipped, {config} does not fit this {gpu_gb:.0f} GB GPU in gpu1_colocated")
        return 2
    from palaestra.shared.jobs import run_job

    summary = run_job(cfg)
    print(f"gpu_check --paper-step: one step of {config} ran: {summary}")
    return 0
