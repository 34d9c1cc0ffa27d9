"""Benchmark of AED's simulator loop.

Prints, measured in the same run:
- adversary-env steps/s in one process, and with 2 parallel worker processes (aggregate), and the scaling ratio;
- the overhead of the adversary env (takeover, frame-by-frame collision attribution, reward state) vs stepping the
  raw highway-env scenario (gymnasium env.step) with the same number of vehicles;
- the share of a training step spent in the simulator vs the policy update (SB3 DQN, timing wrapper around the env).

Each figure is the median [min-max] of ``--repeats`` runs (at least 5).

    .venv/bin/python tools/bench_aed.py --steps 300 --train-steps 600 --repeats 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import warnings

from benchstats import REPEATS, median, spread


def adversary_steps(args: tuple[str, int, int, int]) -> tuple[int, float]:
    scenario, steps, vehicles, seed = args
    warnings.filterwarnings("ignore")
    from palaestra.aed.env import AdversaryEnv

    env = AdversaryEnv(scenario, "rear_end", overrides={"vehicles_count": vehicles})
    env.reset(seed=seed)
    env.action_space.seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    return steps, time.perf_counter() - start


def raw_steps(scenario: str, steps: int, vehicles: int) -> float:
    from palaestra.aed.scenarios import make_base_env

    env = make_base_env(scenario, {"vehicles_count": vehicles})
    env.reset(seed=0)
    env.action_space.seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - start)


def training_split(scenario: str, steps: int, vehicles: int) -> tuple[float, float]:
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN

    from palaestra.aed.env import AdversaryEnv

    torch.set_num_threads(1)

    class Timed(gym.Wrapper):
        sim = 0.0

        def step(self, action):
            t = time.perf_counter()
            out = self.env.step(action)
            Timed.sim += time.perf_counter() - t
            return out

        def reset(self, **kw):
            t = time.perf_counter()
            out = self.env.reset(**kw)
            Timed.sim += time.perf_counter() - t
            return out

    env = Timed(AdversaryEnv(scenario, "rear_end", overrides={"vehicles_count": vehicles}))
    model = DQN(
        "MlpPolicy",
        env,
        learning_starts=50,
        train_freq=1,
        batch_size=32,
        device="cpu",
        seed=0,
        policy_kwargs={"net_arch": [64, 64]},
    )
    start = time.perf_counter()
    model.learn(steps)
    total = time.perf_counter() - start
    return Timed.sim / total, steps / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="highway")
    parser.add_argument("--steps", type=int, default=300, help="env steps per worker")
    parser.add_argument("--vehicles", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    one, two, raw, share, train_sps = [], [], [], [], []
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        pool.map(adversary_steps, [(args.scenario, 5, args.vehicles, s) for s in (1, 2)])  # warm up imports
        for rep in range(args.repeats):
            n, secs = adversary_steps((args.scenario, args.steps, args.vehicles, 10 * rep))
            one.append(n / secs)
            start = time.perf_counter()
            jobs = [(args.scenario, args.steps, args.vehicles, 10 * rep + s) for s in (1, 2)]
            results = pool.map(adversary_steps, jobs)
            two.append(sum(r[0] for r in results) / (time.perf_counter() - start))
            raw.append(raw_steps(args.scenario, args.steps, args.vehicles))
    for _ in range(args.repeats):
        s, sps = training_split(args.scenario, args.train_steps, args.vehicles)
        share.append(s)
        train_sps.append(sps)
    f = ".1f"
    print(f"scenario {args.scenario}, {args.vehicles} vehicles, {args.steps} steps per worker")
    print(f"env steps/s, median [min-max] of {args.repeats} runs")
    print(f"adversary env, 1 worker : {spread(one, f)}")
    print(f"adversary env, 2 workers: {spread(two, f)}   scaling ratio x{median(two) / median(one):.2f}")
    print(f"raw highway-env step    : {spread(raw, f)}   adversary-env overhead ratio {median(raw) / median(one):.2f}")
    print(
        f"DQN training            : {spread(train_sps, f)}   "
        f"simulator share {spread([100 * s for s in share], '.0f')}%, "
        f"policy update + rest {100 - 100 * median(share):.0f}%"
    )


if __name__ == "__main__":
    main()
