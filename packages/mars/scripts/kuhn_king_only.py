"""How much of the Kuhn revision-5 result is one move: betting and calling more with the King.

    python packages/mars/scripts/kuhn_king_only.py

For each seed it takes the warm start's policy and the policy after 60 RL steps, as read off the model
(docs/experiments/, revision 5: P(<BET>) at the 12 information states, two decimals), and prints OpenSpiel's
exact exploitability of: the warm start, RL's policy, the warm start with only RL's four King probabilities, and
the warm start with the King's set to 1 (always bet or call holding K).
"""

from __future__ import annotations

import pyspiel
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import exploitability

STATES = ["0", "1", "2", "0p", "1p", "2p", "0b", "1b", "2b", "0pb", "1pb", "2pb"]
# docs/experiments/, Kuhn revision 5: P(<BET>) at step 0 (warm start) and step 60, seeds 0-2
REVISION_5 = {
    0: (
        [0.51, 0.51, 0.52, 0.38, 0.35, 0.75, 0.39, 0.35, 0.75, 0.41, 0.42, 0.43],
        [0.72, 0.72, 0.73, 0.48, 0.48, 0.92, 0.45, 0.46, 0.92, 0.60, 0.61, 0.63],
    ),
    1: (
        [0.32, 0.32, 0.70, 0.32, 0.32, 0.71, 0.32, 0.32, 0.70, 0.32, 0.32, 0.62],
        [0.40, 0.40, 0.87, 0.40, 0.40, 0.88, 0.39, 0.39, 0.88, 0.39, 0.39, 0.86],
    ),
    2: (
        [0.38, 0.38, 0.80, 0.37, 0.37, 0.82, 0.38, 0.38, 0.81, 0.45, 0.46, 0.81],
        [0.37, 0.38, 0.94, 0.37, 0.37, 0.94, 0.37, 0.37, 0.94, 0.39, 0.41, 0.94],
    ),
}
GAME = pyspiel.load_game("kuhn_poker")


def kuhn_exploitability(bet: list[float]) -> float:
    """OpenSpiel's exact exploitability of the policy betting (or calling) with probability bet[i] at STATES[i]."""
    table = policy_lib.TabularPolicy(GAME)
    for state, b in zip(STATES, bet):
        table.action_probability_array[table.state_lookup[state]] = [1 - b, b]
    return exploitability.exploitability(GAME, table)


def main() -> None:
    king = [i for i, s in enumerate(STATES) if s.startswith("2")]
    print("| seed | warm start | after RL | warm start + RL's K only | warm start + K always bets/calls |")
    print("| --- | --- | --- | --- | --- |")
    for seed, (warm, rl) in REVISION_5.items():
        king_rl = [rl[i] if i in king else p for i, p in enumerate(warm)]
        king_1 = [1.0 if i in king else p for i, p in enumerate(warm)]
        values = [kuhn_exploitability(p) for p in (warm, rl, king_rl, king_1)]
        print(f"| {seed} | " + " | ".join(f"{v:.3f}" for v in values) + " |")


if __name__ == "__main__":
    main()
