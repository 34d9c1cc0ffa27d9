"""The layout section of `palaestra plan`: for a named layout (rl/layout.py), what each GPU holds and whether it
fits an 80 GB and a 141 GB GPU (A100/H100 and H200).

Per GPU kind: the learner's parts (plan_memory.py `learner_memory`, one rank or the in-process learner), a vLLM
engine's budget (``gpu_memory_utilization`` of the GPU: bf16 weights, `VLLM_OVERHEAD_GB`, the KV cache), the
trainer's process. Colocated, a GPU holds a learner rank and an engine, in two phases:

- the rollout: what the learner keeps (`KEPT`: after each update it drops its gradients and hands PyTorch's
  cached blocks back, rl/learner.py `release_memory`) and the engine awake;
- the update: the learner's peak and the engine asleep (level 1: weights in CPU memory, KV cache discarded),
  `VLLM_ASLEEP_GB` left (its CUDA context and allocations outside its memory pool: an estimate, not measured).

The sleep mode's saving is the engine's budget less that residue; a GPU fits when both phases do and the engine's
KV cache holds one sequence of the model's whole context (vLLM's ``max_model_len``: it refuses to start otherwise).
"""

from __future__ import annotations

from palaestra.shared.plan_memory import GB, RUNTIME_RESERVE_GB, ModelArch, engine_tokens, learner_total, vllm_memory

VLLM_ASLEEP_GB = 1.0
"""What a vLLM engine keeps on its GPU asleep at level 1 (an estimate; vLLM logs the figure as it sleeps)."""
GPU_SIZES = (80.0, 141.0)
KEPT = ("weights", "optimizer", "reference", "reserve")
"""What a colocated learner keeps through the rollout: it drops its gradients and cached blocks after each update
(rl/learner.py `release_memory`)."""


def _verdicts(totals: dict[float, float]) -> str:
    return ", ".join(f"{gb:g} GB {'fits' if t <= gb * GB else 'DOES NOT FIT'}" for gb, t in totals.items())


def layout_lines(
    cfg, arch: ModelArch, parts: dict[str, float], trainer_bytes: float, gpu_gb: float = 80.0
) -> tuple[list[str], bool]:
    """The layout section for `cfg` (its ``layout`` named, already applied) at each of `GPU_SIZES` and `gpu_gb`,
    and whether it fits GPUs of `gpu_gb`. `parts`: one learner device's (`learner_memory`); `trainer_bytes`: the
    trainer process's GPU bytes without its reserve (0: no GPU of its own)."""
    from palaestra.shared.rl.layout import LAYOUTS, Layout

    spec = LAYOUTS[Layout(cfg.layout)]
    need = engine_tokens(arch, cfg)  # vLLM starts only with one whole max_model_len sequence in its KV cache
    sizes = tuple(sorted({*GPU_SIZES, gpu_gb}))
    llm = cfg.workers.llm
    g = lambda b: f"{b / GB:6.2f}"  # noqa: E731
    learner = learner_total(parts)
    held = (
        f"weights {g(parts['weights'])}, gradients {g(parts['gradients'])}, AdamW {g(parts['optimizer'])}, "
        f"reference {g(parts['reference'])}"
    )
    world = cfg.learner.world_size
    rank = f"learner rank (1/{world}, {cfg.learner.strategy})" if world > 1 else "learner (the trainer's process)"
    others = " | ".join(v for v in Layout if v != cfg.layout)
    lines = [f"layout {cfg.layout}: {spec.gpus} GPU(s) (the others: layout={others})"]
    fits: dict[float, bool] = {}
    if spec.colocated:
        lines.append(
            f"  each GPU: one {rank} and one vLLM engine (sleep mode, gpu_memory_utilization "
            f"{llm.gpu_memory_utilization:g}); the trainer's process: {cfg.llm.device}"
        )
        kept = sum(parts[k] for k in KEPT)
        lines.append(
            f"  {rank}: {held}; update peak {g(learner)}; kept through the rollout {g(kept)} (weights, AdamW, "
            f"reference, reserve: rl/learner.py release_memory); vLLM needs {need} tokens (the model's context)"
        )
        for gb in sizes:
            v = vllm_memory(arch, gb, llm.gpu_memory_utilization, llm.tensor_parallel_size)
            rollout, update = kept + v["budget"], learner + VLLM_ASLEEP_GB * GB
            ok = rollout <= gb * GB and update <= gb * GB and v["kv_tokens"] >= need
            fits[gb] = ok
            lines.append(
                f"  {gb:g} GB GPU: vLLM awake {g(v['budget'])} (weights {g(v['weights'])}, KV cache "
                f"{g(v['kv_cache'])} = {v['kv_tokens'] / 1e3:.0f}k tokens); rollout phase {g(rollout)}; update phase "
                f"{g(update)} (asleep {VLLM_ASLEEP_GB:g}, sleep mode frees {g(v['budget'] - VLLM_ASLEEP_GB * GB)})"
                f"  {'fits' if ok else 'DOES NOT FIT'}"
            )
    else:
        lines.append(
            f"  {cfg.learner.world_size} GPU(s): {rank} {held}; total {g(learner)}  {_verdicts(_each(learner, sizes))}"
        )
        for gb in sizes:
            fits[gb] = learner <= gb * GB
        if cfg.workers.num_workers:
            per = {}
            for gb in sizes:
                v = vllm_memory(arch, gb, llm.gpu_memory_utilization, llm.tensor_parallel_size)
                per[gb] = v
                fits[gb] = fits[gb] and v["kv_tokens"] >= need
            kv = ", ".join(
                f"{gb:g} GB: KV cache {g(v['kv_cache'])} = {v['kv_tokens'] / 1e3:.0f}k tokens" for gb, v in per.items()
            )
            lines.append(
                f"  {cfg.workers.num_workers} GPU(s): one vLLM engine each (gpu_memory_utilization "
                f"{llm.gpu_memory_utilization:g}, weights {g(2 * arch.params())}; {kv})"
            )
        if trainer_bytes:
            driver = trainer_bytes + RUNTIME_RESERVE_GB * GB
            lines.append(
                f"  1 GPU ({cfg.llm.device}): the trainer's process, float32 model and the reference it saves "
                f"{g(trainer_bytes)} + reserve {RUNTIME_RESERVE_GB:g} = {g(driver)}  {_verdicts(_each(driver, sizes))}"
            )
            for gb in sizes:
                fits[gb] = fits[gb] and driver <= gb * GB
    lines.append(
        f"  layout {cfg.layout}: "
        + ", ".join(f"{gb:g} GB GPUs {'fit' if ok else 'DO NOT FIT'}" for gb, ok in fits.items())
    )
    return lines, fits[gpu_gb]


def _each(total: float, sizes: tuple[float, ...]) -> dict[float, float]:
    return {gb: total for gb in sizes}


SERVE_UTILIZATION = 0.9
"""``vllm serve``'s default ``--gpu-memory-utilization``."""


def served_lines(model: str, utilization: float = SERVE_UTILIZATION, context: int = 16384) -> list[str]:
    """The one-GPU layout of a served LLM (a teacher for datagen, AED's reward designer and judge): ``vllm serve
    MODEL`` alone on a GPU of each of `GPU_SIZES`, its bf16 weights and the KV cache left, in `context`-token
    sequences (for a package's `plan.JOB_PLANS` entry and the configs' comments)."""
    from palaestra.shared.plan_memory import model_arch

    arch, _ = model_arch(model)
    lines = [f"served LLM {model}: one GPU, vllm serve --gpu-memory-utilization {utilization:g}"]
    for gb in GPU_SIZES:
        v = vllm_memory(arch, gb, utilization, 1)
        ok = v["kv_tokens"] >= context
        lines.append(
            f"  {gb:g} GB GPU: weights {v['weights'] / GB:.2f} + KV cache {v['kv_cache'] / GB:.2f} GB = "
            f"{v['kv_tokens'] / 1e3:.0f}k tokens ({v['kv_tokens'] / context:.1f} sequences of {context})  "
            f"{'fits' if ok else 'DOES NOT FIT'}"
        )
    return lines


def served_plan_lines(llm) -> list[str]:
    """`served_lines` of a job's served model (``llm.backend: openai``, e.g. ``vllm serve``), for its `JOB_PLANS`
    entry; a model whose architecture is not known offline gets one line saying so. Other backends: none."""
    if llm.backend != "openai":
        return []
    try:
        return served_lines(llm.model)
    except ValueError as err:
        return [f"served LLM {llm.model}: no one-GPU figures ({err})"]
