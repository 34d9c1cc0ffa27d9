"""The paper-config step of tools/gpu_check.py: one training step of a paper config in its one-GPU layout.

    python tools/gpu_check.py --paper-step experiments/mars/qwen3_4b.yaml [--plan-only]

It resolves the config in its one-GPU layout (rl/layout.py: the learner in this process and one vLLM engine on the
same GPU, sleeping through the update): ``gpu1_colocated`` where it fits this GPU (Qwen3-4B: 141 GB, an H200),
else ``gpu1_offload`` (AdamW's state in CPU memory: 80 GB), with a one-step budget (`ONE_STEP`); prints
`palaestra plan`'s report at this GPU's memory, then runs the job for that one step (its model, data and Ray as
the config names them). ``--plan-only`` stops after the plan: what runs without a GPU (the CPU-side parse and
plan, at 141 GB there). Without CUDA the step says so and is skipped (exit status 2).

Written against vLLM 0.32's sleep mode, untested without a GPU (none was lent when it was written).
"""

from __future__ import annotations

LAYOUTS = ("gpu1_colocated", "gpu1_offload")
"""The one-GPU layouts, the faster first."""
ONE_STEP = (
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
    import torch

    from palaestra.shared.jobs import load_config
    from palaestra.shared.plan import plan_config

    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9 if torch.cuda.is_available() else 141.0
    overrides = list(ONE_STEP)
    if "egpo" in config:  # epochs apply to egpo's epoch sampling only
        overrides.append("task_sampling=replacement")
    for layout in LAYOUTS:  # the first that fits this GPU (the last one's report otherwise)
        cfg = load_config(config, [f"layout={layout}", *overrides])
        report, fits = plan_config(cfg, gpu_gb=gpu_gb, gpus=1)
        if fits:
            break
    print(report)
    if plan_only:
        return 0
    if not torch.cuda.is_available():
        print("gpu_check --paper-step: skipped, no CUDA GPU here (torch.cuda.is_available() is False)")
        return 2
    if not fits:
        print(f"gpu_check --paper-step: skipped, {config} fits a {gpu_gb:.0f} GB GPU in none of {', '.join(LAYOUTS)}")
        return 2
    from palaestra.shared.jobs import run_job

    summary = run_job(cfg)
    print(f"gpu_check --paper-step: one step of {config} ran: {summary}")
    return 0
