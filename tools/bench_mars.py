"""Benchmark: MARS self-play through the text path vs raw OpenSpiel, and MCTS evaluation throughput.

For each game, measured in the same run:
- raw: random playouts straight on pyspiel (sample chance, uniform legal action);
- text env: the same playouts through `GameEnv` with a scripted uniform-random
  player whose response text is rendered and parsed, every observation
  rendered for the acting agent, and the lockstep bookkeeping of `play_episodes`;
- engine: the shared `RolloutEngine` (the training rollout path) with
  `ScriptedLegalClient`, which answers a random legal action as tokens (adds
  chat-template rendering, token deltas and trajectory bookkeeping);
and prints episodes/s and the overhead ratios (raw / text, raw / engine). Then MCTS
evaluation throughput (MCTS vs random, first seat) in games/s and moves/s. Each figure is the
median [min-max] of ``--repeats`` runs (at least 5).

    .venv/bin/python tools/bench_mars.py [--episodes 500] [--engine-episodes 64] [--mcts-games 20] [--simulations 100]
        [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import time

from benchstats import REPEATS, median, repeat, spread

from palaestra.mars.games import GAMES, make_game
from palaestra.mars.play import play_episodes
from palaestra.mars.players import MCTSPlayer, RandomPlayer


def raw_playouts(name: str, episodes: int, seed: int = 0) -> float:
    game = make_game(name).openspiel
    rng = random.Random(seed)
    start = time.perf_counter()
    for _ in range(episodes):
        state = game.new_initial_state()
        while not state.is_terminal():
            if state.is_chance_node():
                outcomes, probs = zip(*state.chance_outcomes())
                state.apply_action(rng.choices(outcomes, weights=probs)[0])
            else:
                state.apply_action(rng.choice(state.legal_actions()))
    return episodes / (time.perf_counter() - start)


def text_playouts(name: str, episodes: int, batch: int = 64) -> float:
    player = RandomPlayer(0)
    start = time.perf_counter()
    for first in range(0, episodes, batch):
        seeds = list(range(first, min(episodes, first + batch)))
        play_episodes(name, [player, player], seeds)
    return episodes / (time.perf_counter() - start)


def engine_playouts(name: str, episodes: int, client) -> float:
    from palaestra.mars.env import GameEnv
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    engine = RolloutEngine(client, RolloutConfig(max_turns=200, max_tokens_per_turn=64, max_context_tokens=1 << 20))
    specs = [EpisodeSpec(lambda: GameEnv(name), seed, str(seed)) for seed in range(episodes)]
    start = time.perf_counter()
    result = engine.run(specs)
    assert result.stats["failed"] == 0, result.stats
    return episodes / (time.perf_counter() - start)


def mcts_throughput(name: str, games: int, simulations: int) -> tuple[float, float]:
    game = make_game(name)
    mcts = MCTSPlayer(game, uct_c=2.0, max_simulations=simulations)
    start = time.perf_counter()
    results = play_episodes(name, [mcts, RandomPlayer(1)], list(range(games)))
    seconds = time.perf_counter() - start
    mcts_moves = sum((r.turns + 1) // 2 for r in results)
    return games / seconds, mcts_moves / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--engine-episodes", type=int, default=64)
    parser.add_argument("--mcts-games", type=int, default=20)
    parser.add_argument("--simulations", type=int, default=100)
    parser.add_argument("--games", nargs="*", default=GAMES.names())
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    n = args.repeats

    from palaestra.mars.scripted_llm import ScriptedLegalClient

    client = ScriptedLegalClient(seed=0)
    print(f"self-play, uniform random legal moves ({args.episodes} episodes; engine: {args.engine_episodes})")
    print(f"episodes/s, median [min-max] of {n} runs")
    print(f"{'game':>14} {'raw':>24} {'text env':>20} {'engine':>16} {'raw/text':>9} {'raw/engine':>11}")
    for name in args.games:
        raw = repeat(lambda name=name: raw_playouts(name, args.episodes), n)
        text = repeat(lambda name=name: text_playouts(name, args.episodes), n)
        eng = repeat(lambda name=name: engine_playouts(name, args.engine_episodes, client), n)
        ratios = (median(raw) / median(text), median(raw) / median(eng))
        print(
            f"{name:>14} {spread(raw):>24} {spread(text):>20} {spread(eng):>16} {ratios[0]:>8.1f}x {ratios[1]:>10.0f}x",
            flush=True,
        )

    print(f"\nMCTS evaluation (uct_c 2, {args.simulations} simulations, random rollouts) vs random, first seat")
    print(f"{'game':>14} {'games/s':>18} {'MCTS moves/s':>20}")
    for name in ("tic_tac_toe", "connect_four", "kuhn_poker", "leduc_poker"):
        runs = [mcts_throughput(name, args.mcts_games, args.simulations) for _ in range(n)]
        games_s, moves_s = [r[0] for r in runs], [r[1] for r in runs]
        print(f"{name:>14} {spread(games_s, '.2f'):>18} {spread(moves_s, '.1f'):>20}", flush=True)


if __name__ == "__main__":
    main()
