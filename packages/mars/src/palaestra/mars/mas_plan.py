"""``palaestra plan`` for ``mars.mas``'s table (`JOB_PLANS`): model requests and generated tokens, per system.

Per question and sample: MAD makes 3 requests a round (affirmative, negative, moderator) for 1 to ``mad_rounds``
rounds, and 2 more for the judge when the moderator never decides, so 3 to 3 x rounds + 2; AutoGen 1 (the
assistant ends at once) to 2 x ``autogen_turns`` - 1 (assistant and proxy alternate); single 1. Tokens: at most
``max_tokens`` a request. A benchmark's questions are counted from its file when it is there, else taken from
the official release's size (`OFFICIAL_SIZES`). Each model (base, trained) makes them all once.
"""

from __future__ import annotations

from pathlib import Path

from palaestra.mars.mas_data import load_benchmark
from palaestra.mars.mas_table import TableConfig, TableSystem
from palaestra.shared.plan import JobPlan

OFFICIAL_SIZES = {
    "gsm8k": 1319,
    "math500": 500,
    "aqua": 254,
    "aime24": 30,
    "amc23": 40,
    "gpqa_diamond": 198,
    "mmlu_stem": 3018,
}
"""Test-set sizes of the official releases (MMLU-STEM: its 18 subjects' test questions)."""


def requests_per_question(system: str, table: TableConfig) -> tuple[int, int]:
    """The fewest and most model requests one question's sample takes."""
    if system == TableSystem.mad:
        return 3, 3 * table.mad_rounds + 2
    if system == TableSystem.autogen:
        return 1, 2 * table.autogen_turns - 1
    return 1, 1


def questions(spec) -> tuple[int, str]:
    """How many questions a benchmark spec asks, and where the count comes from."""
    if Path(spec.path).exists():
        return len(load_benchmark(spec.name, spec.path, spec.limit)), "counted"
    n = OFFICIAL_SIZES[str(spec.name)]
    return (min(n, spec.limit) if spec.limit else n), "official size"


def mas_job_plan(cfg) -> JobPlan:
    """The table's requests and tokens (the job's other systems are small and left out)."""
    table: TableConfig = cfg.table
    if not table.benchmarks:
        return JobPlan("mars.mas: no table.benchmarks, nothing to plan (the debate systems are not estimated)")
    models = 2 if cfg.trained_llm is not None else 1
    head = f"mars.mas table: {models} model(s) x {len(table.benchmarks)} benchmark(s)"
    lines = [f"{head}; at most {table.max_tokens} tokens a request"]
    low = high = 0
    for spec in table.benchmarks:
        n, source = questions(spec)
        k = spec.samples or table.samples
        for system in table.systems:
            fewest, most = requests_per_question(system, table)
            a, b = models * n * k * fewest, models * n * k * most
            low, high = low + a, high + b
            lines.append(f"  {spec.name:>12} ({n} questions, {source}) x k={k} {system:>8}: {a}-{b} requests")
    lines.append(f"total: {low}-{high} requests, at most {high * table.max_tokens:,} generated tokens")
    return JobPlan("\n".join(lines))
