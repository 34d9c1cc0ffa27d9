"""Re-run the cheap README figures and compare them with the README: a table of figure, README, now, command.

Every figure a README states that its command reproduces in minutes is an entry of `FIGURES`: where it is
written, the text as written, the command that measured it, the commit whose README first recorded it (the
figure was measured on the tree just before), about how long it takes on the project's 2-core machine, and how
to read the same figure: from the MLflow run a ``palaestra run`` leaves (`Figure`), or from what a command
prints (`Printed`: ``palaestra plan``, a reference script). Figures that take longer (the SmolLM2 protocol,
mars's tic-tac-toe run, AED's attack and preference runs) are not here: run their commands as their READMEs say.

    python tools/check_figures.py                       # every entry up to --max-minutes (default 10)
    python tools/check_figures.py --only datagen-kept   # one or more entries by name
    python tools/check_figures.py --list                # the entries, their commands and costs; runs nothing

Each run writes under a temporary directory (``--workdir`` to keep it) with its own MLflow store. A changed
figure is not an error: the table is for a person to read (exit 1 only when a command or a reading fails).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
Reader = Callable[[object, str], str]
"""``(MlflowClient, run_id) -> the figure as the README writes it``."""


def _metrics(client, run_id: str) -> dict[str, float]:
    return dict(client.get_run(run_id).data.metrics)


def _history(client, run_id: str, key: str) -> list[float]:
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    if not points:
        raise KeyError(f"no metric {key!r} in run {run_id}")
    return [m.value for m in points]


def eval_before_after(client, run_id: str) -> str:
    """The RL trainer's eval reward before and after training, with its 95% half-width."""
    m = _metrics(client, run_id)
    before = f"{m['result/eval_before_reward_mean']:.2f} ± {m['result/eval_before_reward_ci95']:.2f}"
    return f"{before} -> {m['result/eval_after_reward_mean']:.2f} ± {m['result/eval_after_reward_ci95']:.2f}"


def train_reward_halves(client, run_id: str) -> str:
    """``train/reward_mean`` over steps 1-10 -> 11-20 (and first 5 / last 5), as the egpo README gives it."""
    values = _history(client, run_id, "train/reward_mean")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    half, n = len(values) // 2, len(values)
    first, second = mean(values[:half]), mean(values[half:])
    return (
        f"{first:.3f} over steps 1-{half} -> {second:.3f} over steps {half + 1}-{n}"
        f" (first 5: {mean(values[:5]):.3f}, last 5: {mean(values[-5:]):.3f})"
    )


def datagen_kept(client, run_id: str) -> str:
    m = _metrics(client, run_id)
    kept, attempted = m["result/kept"], m["result/kept"] + m["result/dropped"]
    return f"{kept:.0f} of {attempted:.0f} items kept, {m['stats/calls_per_trace']:.2f} calls per trace"


def kuhn_exploitability(client, run_id: str) -> str:
    """Exploitability of the policy read off the model: at the first evaluation (the warm start) and the last."""
    keys = [k for k in _metrics(client, run_id) if k.startswith("eval/") and k.endswith("/exploitability")]
    key = next((k for k in keys if "equilibrium" not in k), None)
    if key is None:
        raise KeyError(f"no */exploitability metric in run {run_id}")
    values = _history(client, run_id, key)
    return f"{values[0]:.3f} -> {values[-1]:.3f}"


def kuhn_control(client, run_id: str) -> str:  # the RL-free control's one evaluation, after its SFT steps
    return f"RL-free control {_history(client, run_id, 'eval/kuhn_poker/exploitability')[-1]:.3f}"


def mine_weak_target_share(client, run_id: str) -> str:
    """``datagen.mine``'s last round: the share of its targets on tools the student failed on."""
    return f"weak_target_share {_history(client, run_id, 'mine/weak_target_share')[-1]:.3f}"


def lines_between(first: str, last: str, indent: str = "") -> Callable[[str], str]:
    """A reader of printed output: its lines from the one that starts with `first` (leading blanks aside) to the
    next one that holds `last`, each after `indent` (a README code block's own indent)."""

    def read(stdout: str) -> str:
        lines = stdout.splitlines()
        start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(first)), None)
        end = next((i for i in range(start or 0, len(lines)) if last in lines[i]), None)
        if start is None or end is None:
            raise KeyError(f"no lines from {first!r} to {last!r} in the output")
        return "\n".join(indent + line.rstrip() for line in lines[start : end + 1])

    return read


def plan_cpu_hours(stdout: str) -> str:
    """The CPU-hours of a ``palaestra plan`` of AED stages, as the aed README rounds them."""
    found = re.search(r"all stages: ([0-9.]+) CPU-hours", stdout)
    if found is None:
        raise KeyError("no 'all stages: N CPU-hours' line in the output")
    return f"about {found[1]} CPU-hours"


def tictactoe_reference(stdout: str) -> str:
    """The pooled ("both") win rates vs random of `packages/mars/scripts/tictactoe_reference.py`'s table."""
    both = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] != "policy":
            both[cells[0]] = cells[3]
    try:
        return (
            f"uniform random {both['random']}, the warm start's own target {both['first or second listed']}, "
            f"always the first listed move {both['first listed']}, optimal {both['win-maximizing (optimal vs random)']}"
        )
    except KeyError as err:
        raise KeyError(f"no row {err} in the reference table") from None


@dataclass(frozen=True)
class Figure:
    name: str
    readme: str
    """The file that states it."""
    written: str
    """The figure as that file writes it (the check says when the text is no longer there)."""
    config: str
    overrides: tuple[str, ...]
    minutes: float
    """About how long its command takes on the project's 2-core machine."""
    recorded_in: str
    """The commit whose README first gave this figure (``git log -S``); it was measured on the tree before it."""
    read: Reader
    matrix: tuple[str, ...] = ()
    """``--matrix`` axes that pick the one combination (a config with a ``matrix:`` section)."""

    @property
    def command(self) -> str:
        return " ".join(
            ["palaestra run", self.config, *self.overrides, *(("--matrix", *self.matrix) if self.matrix else ())]
        )


@dataclass(frozen=True)
class Printed:
    """A figure that a command prints (no MLflow run): `read` turns its standard output into the README's text."""

    name: str
    readme: str
    written: str
    argv: tuple[str, ...]
    """The command as the README gives it; ``palaestra`` and ``python`` run in this interpreter."""
    minutes: float
    recorded_in: str
    read: Callable[[str], str]

    @property
    def command(self) -> str:
        return " ".join(self.argv)


# The README code blocks, as written (line for line what the command printed).
MARS_PLAN = """\
  total                       29.71  fits
GPUs: 8 learner + vLLM colocated (each holds both) = 8 of 8
layout node8_colocated: 8 GPU(s) (the others: layout=custom | node8_split | gpu1_colocated | gpu1_offload)
  each GPU: one learner rank (1/8, fsdp) and one vLLM engine (sleep mode, gpu_memory_utilization 0.65); the trainer's process: cpu
  learner rank (1/8, fsdp): weights   2.01, gradients   2.01, AdamW   4.02, reference   1.01; update peak  29.71; kept through the rollout  10.04 (weights, AdamW, reference, reserve: rl/learner.py release_memory); vLLM needs 40960 tokens (the model's context)
  80 GB GPU: vLLM awake  52.00 (weights   8.04, KV cache  41.96 = 285k tokens); rollout phase  62.04; update phase  30.71 (asleep 1, sleep mode frees  51.00)  fits
  141 GB GPU: vLLM awake  91.65 (weights   8.04, KV cache  81.61 = 553k tokens); rollout phase 101.69; update phase  30.71 (asleep 1, sleep mode frees  90.65)  fits
  layout node8_colocated: 80 GB GPUs fit, 141 GB GPUs fit"""  # noqa: E501
DATAGEN_PLAN = """\
    probe: the run's first 32 items with the deterministic roles standing in (an oracle reasoner, naive_first_try 0.3): 31 of 32 kept
    expected LLM load for 2,000 items (tokens: characters / 4):
      role              requests   prompt tokens  completion tokens
      tool_maker           4,062         659,609            143,609
      query_writer         4,062         902,781            163,188
      reasoner            12,062           28.1M            661,250
      critic                 500          71,938             20,000
      total               20,688           29.7M            988,047
      10.7 requests per kept sample at the probe's keep rate (0.97)"""  # noqa: E501

FIGURES: list[Figure | Printed] = [
    Figure(
        "datagen-kept",
        "README.md",
        "378 of 400 items kept",
        "experiments/datagen/deterministic.yaml",
        ("workers=0",),  # as measured: in process (Ray workers merge the graph's counts in other batches)
        3,
        "512c415",
        datagen_kept,
    ),
    Figure(
        "toy-rl-eval",
        "README.md",
        "eval reward 0.19 ± 0.07 -> 0.87 ± 0.06",
        "experiments/shared/toy_rl.yaml",
        (),
        3,
        "62362a8",
        eval_before_after,
    ),
    Figure(
        "egpo-tiny-train-reward",
        "packages/egpo/README.md",
        "`train/reward_mean` 0.042 over steps 1-10 -> 0.092 over steps 11-20 (first 5: 0.028, last 5: 0.081)",
        "experiments/egpo/tiny_cpu.yaml",
        (),
        5,
        "62362a8",
        train_reward_halves,
    ),
    Figure(
        "kuhn-seed0-exploitability",
        "README.md",
        "0.245 -> 0.175",
        "experiments/mars/kuhn_cpu.yaml",
        (),
        7,
        "62362a8",
        kuhn_exploitability,
        ("seed=0", "arm=rl"),
    ),
    Figure(
        "kuhn-seed0-control",
        "README.md",
        "RL-free control 0.318",
        "experiments/mars/kuhn_cpu.yaml",
        (),
        12,
        "a4abfed",
        kuhn_control,
        ("seed=0", "arm=control"),
    ),
    Figure(
        "datagen-mine-tiny",
        "packages/datagen/README.md",
        "weak_target_share 0.833",
        "experiments/datagen/mine_tiny.yaml",
        (),
        1.5,
        "62362a8",
        mine_weak_target_share,
    ),
    Printed(
        "mars-qwen3-4b-plan",
        "README.md",
        MARS_PLAN,
        ("palaestra", "plan", "experiments/mars/qwen3_4b.yaml"),
        0.5,
        "da72b8d",
        lines_between("total", "  layout node8_colocated: "),
    ),
    Printed(
        "datagen-llm-served-plan",
        "packages/datagen/README.md",
        DATAGEN_PLAN,
        ("palaestra", "plan", "experiments/datagen/llm_served.yaml"),
        0.5,
        "4b6fcb0",
        lines_between("probe:", "requests per kept sample", "    "),
    ),
    Printed(
        "aed-compare-cpu-plan",
        "packages/aed/README.md",
        "about 1.3 CPU-hours",
        ("palaestra", "plan", "experiments/aed/compare_cpu.yaml"),
        0.2,
        "62362a8",
        plan_cpu_hours,
    ),
    Printed(
        "tictactoe-reference",
        "README.md",
        "uniform random 0.437, the warm start's own target 0.522, always the first listed move 0.611, optimal 0.967",
        ("python", "packages/mars/scripts/tictactoe_reference.py"),
        1,
        "e385ee2",
        tictactoe_reference,
    ),
]


def run_printed(figure: Printed) -> tuple[str, float]:
    """Run the command in this interpreter; return (the figure read from what it printed, minutes it took)."""
    program, *args = figure.argv
    head = {"palaestra": [sys.executable, "-m", "palaestra.shared.cli"], "python": [sys.executable]}[program]
    start = time.monotonic()
    done = subprocess.run([*head, *args], cwd=ROOT, capture_output=True, text=True)
    minutes = (time.monotonic() - start) / 60
    if done.returncode not in (0, 1):  # `palaestra plan` exits 1 for a plan that does not fit: still a figure
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"FAILED (exit {done.returncode}): {last}", minutes
    try:
        return figure.read(done.stdout), minutes
    except KeyError as err:
        return f"FAILED: {err}", minutes


def run_figure(figure: Figure | Printed, workdir: Path) -> tuple[str, float]:
    """Run the figure's command into `workdir`; return (the figure now, minutes it took)."""
    if isinstance(figure, Printed):
        return run_printed(figure)
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    argv = [
        sys.executable,
        "-m",
        "palaestra.shared.cli",
        "run",
        str(ROOT / figure.config),
        *figure.overrides,
        f"output_dir={workdir / figure.name}",
        f"tracking.uri={uri}",
        f"tracking.artifact_root={workdir / 'artifacts'}",
        "tracking.experiment=check_figures",
        *(("--matrix", *figure.matrix) if figure.matrix else ()),
    ]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    minutes = (time.monotonic() - start) / 60
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"FAILED (exit {done.returncode}): {last}", minutes
    found = re.search(r"\brun ([0-9a-f]{32}) in experiment", done.stdout)
    if found is None:
        return "FAILED: no MLflow run id in the command's output", minutes
    client = MlflowClient(uri)
    run_id = found[1]
    experiment = client.get_run(run_id).info.experiment_id
    children = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
    if figure.matrix and len(children) == 1:  # a matrix of one combination: its run holds the figure
        run_id = children[0].info.run_id
    try:
        return figure.read(client, run_id), minutes
    except KeyError as err:
        return f"FAILED: {err}", minutes


def table(rows: list[list[str]]) -> str:
    header = ["figure", "README", "now", "command"]
    rows = [[" / ".join(" ".join(line.split()) for line in cell.splitlines()) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these entries (see --list)")
    parser.add_argument("--max-minutes", type=float, default=10, help="skip entries that take longer (default 10)")
    parser.add_argument("--list", action="store_true", help="print the entries and run nothing")
    parser.add_argument("--workdir", help="keep the runs' files here (default: a temporary directory)")
    args = parser.parse_args(argv)
    names = {f.name for f in FIGURES}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"unknown entries {unknown}; known: {', '.join(sorted(names))}")
    chosen = [f for f in FIGURES if (f.name in args.only if args.only else f.minutes <= args.max_minutes)]
    if args.list:
        for f in FIGURES:
            print(f"{f.name}: ~{f.minutes:g} min, {f.readme} (recorded in {f.recorded_in}): {f.command}")
        return 0
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="check-figures-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    for figure in chosen:
        print(f"== {figure.name}: {figure.command} (~{figure.minutes:g} min)", flush=True)
        written = figure.written
        if written not in (ROOT / figure.readme).read_text():
            written += " (no longer in the README)"
        now, minutes = run_figure(figure, workdir)
        failed |= now.startswith("FAILED")
        print(f"   now: {now} ({minutes:.1f} min)", flush=True)
        rows.append(
            [
                figure.name,
                f"{written} [{figure.readme} @ {figure.recorded_in}]",
                f"{now} ({minutes:.1f} min)",
                figure.command,
            ]
        )
    print("\n" + table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
