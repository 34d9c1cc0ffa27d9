"""Benchmark: MARS self-play through the text path vs raw OpenSpiel, and MCTS evaluation throughput.

For each game, measured in the same run:
- raw: random playouts straight on pyspiel (sample chance, uniform legal action);
- text env: the same playouts through `GameEnv` with a scripted uniform-random
  player whose response text is rendered and parsed, every observation
  rendered for the acting agent, and the lockstep bookkeeping of `play_episodes`;
- engine (optional, ``--engine``): the shared `RolloutEngine` with a scripted
  client that answers the random legal action as tokens (adds tokenization
  through the chat template);
and prints episodes/s and the overhead ratio (raw / text). Then MCTS
evaluation throughput (MCTS vs random, first seat) in games/s and moves/s.

    .venv/bin/python tools/bench_mars.py [--episodes 500] [--mcts-games 20] [--simulations 100]
"""

from __future__ import annotations

import argparse
import random
import time

from palaestra.mars.games import GAME_FACTORIES, make_game
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
    parser.add_argument("--mcts-games", type=int, default=20)
    parser.add_argument("--simulations", type=int, default=100)
    parser.add_argument("--games", nargs="*", default=list(GAME_FACTORIES))
    args = parser.parse_args()

    print(f"self-play, uniform random policy, {args.episodes} episodes per game")
    print(f"{'game':>14} {'raw ep/s':>10} {'text ep/s':>10} {'overhead':>9}")
    for name in args.games:
        raw = raw_playouts(name, args.episodes)
        text = text_playouts(name, args.episodes)
        print(f"{name:>14} {raw:>10.0f} {text:>10.0f} {raw / text:>8.1f}x", flush=True)

    print(f"\nMCTS evaluation (uct_c 2, {args.simulations} simulations, random rollouts) vs random, first seat")
    print(f"{'game':>14} {'games/s':>9} {'MCTS moves/s':>13}")
    for name in ("tic_tac_toe", "connect_four", "kuhn_poker", "leduc_poker"):
        games_s, moves_s = mcts_throughput(name, args.mcts_games, args.simulations)
        print(f"{name:>14} {games_s:>9.2f} {moves_s:>13.1f}", flush=True)


if __name__ == "__main__":
    main()
