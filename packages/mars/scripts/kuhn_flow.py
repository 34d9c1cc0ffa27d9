"""Where self-play policy gradient takes a Kuhn poker policy that reads only its card, in expectation.

    python packages/mars/scripts/kuhn_flow.py 0.1 0.1 0.8 [0.3 0.3 0.8 ...] [--time 60] [--every 10]

Each triple is a card-only policy: its probability of <BET> (bet, or call when facing a bet) holding J, Q, K, at
every betting history, as the policies read off `tiny` after the Kuhn warm start are (docs/experiments/). For
each, the script follows the expected self-play update of one shared policy in both seats (the flow that MARS's
REINFORCE-style update follows on average): in the logit of each card, d z_c / dt = b_c (1 - b_c) * d f / d b_c,
where f(b') = u_first(b' vs b) + u_second(b vs b') is the shared policy's payoff against a frozen copy of
itself in both seats. It prints OpenSpiel's exact exploitability along the way. The time unit is arbitrary (it
stands for lr x steps); only the direction and the shape of the path are predictions.

It showed why revision 4 did not move: from a sharp rule of thumb (J 0.1, Q 0.1, K 0.8; exploitability 0.245)
the flow stays at 0.23-0.25 for a long time and then cycles away, while from J, Q at 0.3 (K 0.5 to 0.8) it falls
to 0.11-0.15 before it cycles back up. Self-play gradient in a zero-sum game need not converge: exploitability
falls only along part of the path.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyspiel
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import exploitability

GAME = pyspiel.load_game("kuhn_poker")


def card_policy(bet: np.ndarray) -> policy_lib.TabularPolicy:
    """The tabular policy that plays <BET> with probability ``bet[card]`` at every information state."""
    table = policy_lib.TabularPolicy(GAME)
    for state, row in table.state_lookup.items():
        table.action_probability_array[row] = [1.0 - bet[int(state[0])], bet[int(state[0])]]  # state: card, history
    return table


def first_seat_value(first: policy_lib.TabularPolicy, second: policy_lib.TabularPolicy) -> float:
    """The first player's expected payoff, by walking OpenSpiel's game tree."""

    def walk(state) -> float:
        if state.is_terminal():
            return state.returns()[0]
        if state.is_chance_node():
            return sum(p * walk(state.child(a)) for a, p in state.chance_outcomes())
        acting = first if state.current_player() == 0 else second
        return sum(p * walk(state.child(a)) for a, p in acting.action_probabilities(state).items())

    return walk(GAME.new_initial_state())


def selfplay_gradient(bet: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """d f / d bet_c with the opponent frozen at ``bet``; central differences are exact here (f is at most
    quadratic in each bet_c: a card is played at most twice per game by its holder)."""
    frozen = card_policy(bet)
    grad = np.zeros(3)
    for card in range(3):
        values = []
        for sign in (1.0, -1.0):
            moved = bet.copy()
            moved[card] += sign * h
            mine = card_policy(moved)
            values.append(first_seat_value(mine, frozen) - first_seat_value(frozen, mine))
        grad[card] = (values[0] - values[1]) / (2 * h)
    return grad


def flow(bet: np.ndarray, time: float, every: float, dt: float = 0.5) -> list[tuple[float, float, np.ndarray]]:
    """(time, exploitability, bet) every ``every`` time units along the expected self-play path (Euler, step dt)."""
    logits = np.log(bet / (1.0 - bet))
    path, t = [], 0.0
    while True:
        now = 1.0 / (1.0 + np.exp(-logits))
        if round(t / every, 6).is_integer():
            path.append((t, exploitability.exploitability(GAME, card_policy(now)), now))
        if t >= time - 1e-9:
            return path
        logits = logits + dt * now * (1.0 - now) * selfplay_gradient(now)
        t += dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bets", nargs="+", type=float, help="triples: P(<BET>) holding J, Q, K")
    parser.add_argument("--time", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=10.0)
    args = parser.parse_args()
    if len(args.bets) % 3 or not all(0.0 < b < 1.0 for b in args.bets):
        raise SystemExit("give triples of probabilities strictly between 0 and 1 (J Q K ...)")
    for start in np.array(args.bets).reshape(-1, 3):
        print(f"start J {start[0]:.2f} Q {start[1]:.2f} K {start[2]:.2f}")
        for t, value, now in flow(start, args.time, args.every):
            print(f"  t {t:5.1f}  exploitability {value:.3f}  J {now[0]:.2f} Q {now[1]:.2f} K {now[2]:.2f}")


if __name__ == "__main__":
    main()
