"""Benchmark of bounded-staleness rollouts that can fail: the asynchronous step against the synchronous step's
rollout and update, each timed alone, in the same run.

The task is experiments/shared/toy_rl.yaml (`tiny`; no SFT warm-up and no evaluation, which do not change a
step's cost). Every setting's trainer is built first and kept; the run then visits them in turn (``--rounds``
rounds, every other one in reverse order: ABBA), each visit ``--warmup`` steps that fill its pipeline again and
``--steps`` measured ones, and it ends by waiting for its rollouts in flight, so no setting's rollouts run while
another is measured. A drift of the machine's load over the run thus falls on every setting alike. Settings:

- ``sync`` (max_staleness 0): the trainer's rollout (`RolloutStream.take`) and its update (every policy's
  `Trainer.update_policy` and the weight sync) are each timed around their own call. Nothing else runs
  meanwhile, so these are the rollout alone and the update alone.
- ``k=1``, ``k=2``: the asynchronous step (the wall time of `Trainer.train_step`).
- ``serial`` (the negative control): k = 1, but the step waits for the rollouts in flight
  (`RolloutStream.drain`) before its update, so the next rollout and the update run one after the other. Its
  ratio must come out near (rollout + update) / max(rollout, update); a measurement that reported overlap
  here would be broken.

Each setting's ``ratio`` is its step over max(rollout alone, update alone) (the sync medians): 1 is a perfect
overlap. Each step's own rollout (its engine's ``rollout_s``) and own update are also reported, and the step
over their sum: about 1 for the control whatever the load, below 1 where they overlapped. ``speedup`` is the
sync step over this step. Figures are median [min-max] over the measured steps (``--rounds`` x ``--steps``, at
least 5, tools/benchstats.py).
The default step (`BALANCED`) has 2 tasks of 8 and answers of up to 32 tokens, so rollout and update are of
similar size; later ``key=value`` overrides win (``rollout.max_tokens_per_turn=128``: a rollout-bound step).

Placement is set here, not left to Ray: torch uses one thread; with ``--cores L R`` every thread of the
learner's process is pinned to core L and every thread of each rollout worker (a Ray actor's process, or the
in-process background thread with ``--layout local``) to core R (``os.sched_setaffinity`` per thread), and
all of them get the same nice value: the learner's (Ray starts its workers at 19), or without the privilege to
lower a nice value the workers' (raising one needs none).
``--cores none`` leaves placement to the OS. The load average is printed before and after.

    .venv/bin/python tools/bench_async.py [--steps 2] [--rounds 3] [--warmup 2] [--layout ray|local]
        [--cores 0 1 | none] [--settings sync k=1 k=2 serial] [key=value ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchstats import REPEATS, spread

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "shared" / "toy_rl.yaml"
BALANCED = ["tasks_per_step=2", "rollout.max_tokens_per_turn=32"]
"""The default step: rollout and update of similar size (toy_rl's own is update-bound: 0.05 s vs 0.45 s)."""
SETTINGS = {"sync": 0, "k=1": 1, "k=2": 2, "serial": 1}
"""Each setting's max_staleness; ``serial`` is the no-overlap control."""


# -- the arithmetic (tests/test_bench_async.py) -------------------------------------------------------------------
def ratios(steps: Sequence[float], rollout_alone: float, update_alone: float) -> list[float]:
    """Each step over max(rollout alone, update alone): 1 is a perfect overlap."""
    bound = max(rollout_alone, update_alone)
    if bound <= 0:
        raise ValueError(f"rollout and update times must be positive (got {rollout_alone}, {update_alone})")
    return [s / bound for s in steps]


def no_overlap(rollout_alone: float, update_alone: float) -> float:
    """The ratio a step gets when rollout and update run one after the other: (rollout + update) / max."""
    return (rollout_alone + update_alone) / max(rollout_alone, update_alone)


def speedup(sync_steps: Sequence[float], steps: Sequence[float]) -> float:
    """The synchronous median step over this setting's median step."""
    return statistics.median(sync_steps) / statistics.median(steps)


def order(settings: Sequence[str], rounds: int) -> list[str]:
    """The settings' runs: `rounds` rounds, every other one reversed (ABBA), so a drift of the machine's load
    over the run falls on every setting alike."""
    return [name for r in range(rounds) for name in (settings if r % 2 == 0 else list(reversed(settings)))]


def table(rows: dict[str, dict[str, list[float]]]) -> list[str]:
    """The markdown table: the sync row's rollout and update alone; each setting's step, its rollout's and its
    update's own times (asynchronous: overlapped, so contended), the step over their sum (about 1 without
    overlap: the control's check on its own times; max / sum at a perfect one), the ratio and the speedup."""
    sync = rows["sync"]
    r, u = statistics.median(sync["rollout"]), statistics.median(sync["update"])
    lines = [
        f"rollout alone {spread(sync['rollout'], '.3f')} s, update alone {spread(sync['update'], '.3f')} s: "
        f"no overlap would give {no_overlap(r, u):.2f}, a perfect one 1.00",
        "| setting | step s | rollout s (its own) | update s (its own) | step / (its rollout + its update) "
        "| step / max(rollout alone, update alone) | speedup |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, f in rows.items():
        cells = [spread(f[key], ".3f") for key in ("step", "rollout", "update")]
        own = [step / (ro + up) for step, ro, up in zip(f["step"], f["rollout"], f["update"])]
        cells += [spread(own, ".2f"), spread(ratios(f["step"], r, u), ".2f")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {speedup(sync['step'], f['step']):.2f}x |")
    return lines


# -- placement -----------------------------------------------------------------------------------------------------
def threads_of(pid: int) -> list[int]:
    """Every thread id of process `pid` (Linux: /proc/<pid>/task)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return [pid]


def place(tids: Sequence[int], core: int | None, nice: int) -> bool:
    """Pin threads `tids` to `core` (None: leave them) and give each the nice value `nice`; False where a nice
    value could not be lowered to `nice` (no privilege)."""
    done = True
    for tid in tids:
        try:
            if core is not None:
                os.sched_setaffinity(tid, {core})
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
        except PermissionError:
            done = False
    return done


def rollout_threads(trainer) -> tuple[list[int], list[int]]:
    """The thread ids that run `trainer`'s rollouts, and the processes they are in (none: this one's)."""
    workers, stream = getattr(trainer.rollouts, "workers", None), trainer.stream
    if workers is not None:  # Ray actors: their processes
        import ray

        pids = ray.get([w.pid.remote() for w in workers])
        return [t for pid in pids for t in threads_of(pid)], pids
    if stream.pool is not None:  # the background thread (one thread: the same one runs every rollout)
        return [stream.pool.submit(threading.get_native_id).result()], []
    return [], []  # synchronous in-process rollouts run on the learner's thread


def placement(trainers: Sequence, cores: tuple[int, int] | None) -> str:
    """Pin the learner's process and every trainer's rollouts (module docstring); returns what was done."""
    found = [rollout_threads(t) for t in trainers]
    rollout_tids = [tid for tids, _ in found for tid in tids]
    pids = [pid for _, ps in found for pid in ps]
    learner_tids = [t for t in threads_of(os.getpid()) if t not in rollout_tids]
    # Ray starts its workers at nice 19: every thread at the learner's nice, or where that cannot be had (no
    # privilege to lower a nice value), at the highest of the processes' (raising one needs none)
    nice = os.getpriority(os.PRIO_PROCESS, os.getpid())
    if not place(rollout_tids, cores[1] if cores else None, nice):
        nice = max(os.getpriority(os.PRIO_PROCESS, p) for p in pids)
        place(rollout_tids, None, nice)
    place(learner_tids, cores[0] if cores else None, nice)
    where = f"learners on core {cores[0]}, rollouts on core {cores[1]}" if cores else "cores left to the OS"
    return f"{where}, {len(learner_tids)} + {len(rollout_tids)} threads at nice {nice}"


# -- one setting ---------------------------------------------------------------------------------------------------
def timed(fn: Callable, into: list[float]) -> Callable:
    """`fn`, adding each call's wall time to the last entry of `into`."""

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into[-1] += time.perf_counter() - t0

    return wrapper


class Setting:
    """One setting's trainer, kept for the whole run, with its measuring hooks; `visit` runs some steps of it."""

    def __init__(self, name: str, args, stack: contextlib.ExitStack):
        import palaestra.shared.rl.train  # noqa: F401  (registers rl.train)
        from palaestra.shared.jobs import load_config
        from palaestra.shared.rl.config import TrainConfig
        from palaestra.shared.rl.trainer import Trainer

        ray = ["workers.num_workers=1", "workers.num_cpus=1", f"cluster.num_cpus={2 * len(args.settings)}"]
        overrides = [
            f"output_dir={tempfile.mkdtemp()}",
            "tracking.enabled=false",
            "sft_warmup.steps=0",
            "eval_tasks=0",
            "log_samples=0",
            f"steps={args.rounds * (args.warmup + args.steps)}",
            f"rollout.max_staleness={SETTINGS[name]}",
            *(ray if args.layout == "ray" else ["workers.num_workers=0"]),
            *BALANCED,
            *args.overrides,
        ]
        cfg = load_config(CONFIG, overrides)
        assert isinstance(cfg, TrainConfig)
        self.name, self.trainer = name, stack.enter_context(Trainer(cfg))
        self.trainer.prepare()
        stream = self.trainer.stream
        assert stream is not None
        self.stream = stream
        self.figures: dict[str, list[float]] = {"step": [], "rollout": [], "update": []}
        self.rollout, self.update, self.own = [0.0], [0.0], [0.0]
        plain = stream.take

        def take(step: int):  # the rollout's own time as its engine measured it (overlapped: with the update)
            result = plain(step)
            self.own[-1] = result.stats["rollout_s"]
            return result

        stream.take = take  # type: ignore[method-assign]
        # every setting's update timed around its own calls (asynchronous: while rollouts run beside it)
        self.trainer.update_policy = timed(self.trainer.update_policy, self.update)  # type: ignore[method-assign]
        stream.sync = timed(stream.sync, self.update)  # type: ignore[method-assign]
        if name == "sync":
            stream.take = timed(take, self.rollout)  # type: ignore[method-assign]
        elif name == "serial":  # the control: the rollouts in flight end before the update starts

            def take_then_drain(step: int):
                result = take(step)
                stream.drain()
                return result

            stream.take = take_then_drain  # type: ignore[method-assign]

    def visit(self, warmup: int, steps: int) -> None:
        """`warmup` steps (the pipeline fills again), `steps` measured ones, then wait for the rollouts in
        flight, so that none runs while another setting is measured."""
        for step in range(warmup + steps):
            self.rollout[-1] = self.update[-1] = 0.0
            t0 = time.perf_counter()
            self.trainer.train_step()
            if step >= warmup:
                self.figures["step"].append(time.perf_counter() - t0)
                self.figures["rollout"].append(self.rollout[-1] if self.name == "sync" else self.own[-1])
                self.figures["update"].append(self.update[-1])
        self.stream.drain()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="measured steps per visit (rounds x steps >= 5)")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (the pipeline fills)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--layout", choices=["ray", "local"], default="ray", help="1 Ray worker, or in-process")
    parser.add_argument("--cores", nargs="+", default=["0", "1"], help="learner's and rollouts' core, or none")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the settings, every other one reversed")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of toy_rl.yaml")
    args = parser.parse_args()
    if args.steps * args.rounds < REPEATS:
        parser.error(f"--rounds x --steps must be >= {REPEATS} (the measured steps per setting)")
    if "sync" not in args.settings:
        parser.error("--settings needs sync (the rollout and update alone)")
    if args.cores == ["none"]:
        args.cores = None
    elif len(args.cores) != 2 or not all(c.isdigit() for c in args.cores):
        parser.error(f"--cores takes two core numbers or none (got {args.cores})")
    else:
        args.cores = (int(args.cores[0]), int(args.cores[1]))
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with contextlib.ExitStack() as stack:
        settings = {name: Setting(name, args, stack) for name in args.settings}
        where = placement([s.trainer for s in settings.values()], args.cores)
        for name in order(args.settings, args.rounds):
            settings[name].visit(args.warmup, args.steps)
    rows = {name: s.figures for name, s in settings.items()}
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.layout}: {where}")
    print(f"median [min-max] of {args.rounds} x {args.steps} steps, each visit after {args.warmup} warm-up steps")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
