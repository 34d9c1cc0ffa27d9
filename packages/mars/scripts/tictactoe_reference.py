"""Reference lines for tic-tac-toe win rates: simple policies against a uniformly random opponent (exact) and
against MCTS with MARS's settings (uct_c 2, 100 simulations, 10 random rollouts, solve=False; simulated).

    python packages/mars/scripts/tictactoe_reference.py                 # exact lines vs random only
    python packages/mars/scripts/tictactoe_reference.py --mcts 200      # + 200 games per seat vs MCTS (95% Wilson)

Policies (by the LEGAL ACTIONS list the model sees, which is OpenSpiel's legal action order): uniformly random;
the first listed move; the first or second listed move at random (the tiny_cpu.yaml warm start's target); vs
random, the policy that maximizes the win probability (expectimax over OpenSpiel's tree); vs MCTS, a minimax-perfect
player (never loses; among the game-theoretically best moves it picks uniformly). Win rates per seat and pooled
over both seats ("both": the mean of the two seats, as the evaluation's pooled rate with equal episodes per seat).
"""

from __future__ import annotations

import argparse
import functools
import random

import pyspiel

GAME = pyspiel.load_game("tic_tac_toe")
POLICIES = ("random", "first listed", "first or second listed", "best")


def _dist(name: str, state) -> list[tuple[int, float]]:
    legal = state.legal_actions()
    if name == "random":
        return [(a, 1 / len(legal)) for a in legal]
    if name == "first listed":
        return [(legal[0], 1.0)]
    if name == "first or second listed":
        top = legal[:2]
        return [(a, 1 / len(top)) for a in top]
    raise ValueError(name)


def exact_vs_random(name: str, seat: int) -> float:
    """P(the policy in `seat` wins) against a uniformly random opponent, exactly."""

    @functools.cache
    def value(history: tuple[int, ...]) -> float:
        state = GAME.new_initial_state()
        for a in history:
            state.apply_action(a)
        if state.is_terminal():
            return 1.0 if state.returns()[seat] > 0 else 0.0
        children = {a: value((*history, a)) for a in state.legal_actions()}
        if state.current_player() != seat:
            return sum(children.values()) / len(children)
        if name == "best":
            return max(children.values())
        return sum(p * children[a] for a, p in _dist(name, state))

    return value(())


@functools.cache
def _minimax(history: tuple[int, ...]) -> float:
    """The game value for the player to move (1 win, 0 draw, -1 loss) under perfect play."""
    state = GAME.new_initial_state()
    for a in history:
        state.apply_action(a)
    if state.is_terminal():
        return 0.0  # only reached through the caller, which scores terminals itself
    best = -2.0
    for a in state.legal_actions():
        child = state.child(a)
        v = child.returns()[state.current_player()] if child.is_terminal() else -_minimax((*history, a))
        best = max(best, v)
    return best


def _perfect_move(state, rng: random.Random) -> int:
    player, history = state.current_player(), tuple(state.history())
    scores = {}
    for a in state.legal_actions():
        child = state.child(a)
        scores[a] = child.returns()[player] if child.is_terminal() else -_minimax((*history, a))
    best = max(scores.values())
    return rng.choice([a for a, v in scores.items() if v == best])


def vs_mcts(name: str, seat: int, games: int, seed: int = 0) -> tuple[int, int]:
    """(wins, games) of the policy in `seat` against OpenSpiel MCTS with MARS's settings."""
    import numpy as np
    from open_spiel.python.algorithms import mcts

    rng = random.Random(seed * 7 + seat)
    np_rng = np.random.RandomState(seed * 7 + seat)
    bot = mcts.MCTSBot(GAME, 2.0, 100, mcts.RandomRolloutEvaluator(10, np_rng), solve=False, random_state=np_rng)
    wins = 0
    for _ in range(games):
        state = GAME.new_initial_state()
        while not state.is_terminal():
            if state.current_player() != seat:
                state.apply_action(bot.step(state))
            elif name == "best":
                state.apply_action(_perfect_move(state, rng))
            else:
                actions, probs = zip(*_dist(name, state))
                state.apply_action(rng.choices(actions, weights=probs)[0])
        wins += state.returns()[seat] > 0
    return wins, games


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mcts", type=int, default=0, help="games per seat against MCTS (0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from palaestra.shared.stats import wilson_interval

    print("| policy | vs random: first seat | second seat | both |")
    print("| --- | --- | --- | --- |")
    for name in POLICIES:
        first, second = exact_vs_random(name, 0), exact_vs_random(name, 1)
        label = "win-maximizing (optimal vs random)" if name == "best" else name
        print(f"| {label} | {first:.3f} | {second:.3f} | {(first + second) / 2:.3f} |")
    if args.mcts:
        print()
        print(f"| policy | vs MCTS (MARS's settings), {args.mcts} games per seat: first seat | second seat | both |")
        print("| --- | --- | --- | --- |")
        for name in POLICIES:
            cells, total = [], 0
            for seat in (0, 1):
                wins, n = vs_mcts(name, seat, args.mcts, args.seed)
                total += wins
                lo, hi = wilson_interval(wins, n)
                cells.append(f"{wins / n:.3f} [{lo:.3f}, {hi:.3f}]")
            lo, hi = wilson_interval(total, 2 * args.mcts)
            cells.append(f"{total / (2 * args.mcts):.3f} [{lo:.3f}, {hi:.3f}]")
            label = "minimax-perfect" if name == "best" else name
            print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
