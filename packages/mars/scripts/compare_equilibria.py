"""Exploitability of MARS's shipped equilibrium tables beside ours (OpenSpiel's exact best response).

MARS ships ``roll/agentic/env/kuhn_poker/cfr.pkl.gz`` (a pickled OpenSpiel ``TabularPolicy``) and
``roll/agentic/env/leduc_poker/ne.pkl.gz`` (a dict keyed by its own ``_get_state_key``: private and public
card, then each round's calls/raises, with probabilities over fold / call / raise). Ours: CFR for Kuhn and
CFR+ for Leduc (`palaestra.mars.solvers.equilibrium_policy`, cached).

    git clone https://github.com/thu-nics/MARS     # the files are MARS's, not this repository's
    git -C MARS show HEAD:roll/agentic/env/kuhn_poker/cfr.pkl.gz > kuhn_cfr.pkl.gz
    git -C MARS show HEAD:roll/agentic/env/leduc_poker/ne.pkl.gz > leduc_ne.pkl.gz
    python packages/mars/scripts/compare_equilibria.py kuhn_cfr.pkl.gz leduc_ne.pkl.gz
"""

from __future__ import annotations

import gzip
import pickle
import sys
from pathlib import Path

import numpy as np
import pyspiel
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms.exploitability import exploitability

from palaestra.mars.solvers import equilibrium_policy


def mars_leduc_key(state: pyspiel.State) -> str:
    """MARS's ``LeducPokerEnv._get_state_key`` for the acting player, from OpenSpiel's information-state tensor."""
    info = state.information_state_tensor(state.current_player())
    deck = ["J", "J", "Q", "Q", "K", "K"]
    cards = deck[int(np.argmax(info[2:8]))]
    cards += deck[int(np.argmax(info[8:14]))] if np.sum(info[8:14]) > 0 else "_"
    rounds = []
    for start in (14, 22):
        moves = ""
        for i in range(int(np.sum(info[start : start + 8]))):
            moves += "c" if np.argmax(info[start + 2 * i : start + 2 + 2 * i]) == 0 else "r"
        rounds.append(moves)
    return f"[{cards}]_[{rounds[0]}]_[{rounds[1]}]"


def leduc_table_policy(table: dict) -> policy_lib.TabularPolicy:
    game = pyspiel.load_game("leduc_poker")
    tabular = policy_lib.TabularPolicy(game)
    for state in tabular.states:
        legal = state.legal_actions()
        probs = np.array([table[mars_leduc_key(state)][a] for a in legal], dtype=np.float64)
        row = tabular.policy_for_key(state.information_state_string())
        row[:] = 0.0
        row[legal] = probs / probs.sum() if probs.sum() > 0 else 1.0 / len(legal)
    return tabular


def main(kuhn_path: str, leduc_path: str) -> None:
    with gzip.open(kuhn_path, "rb") as f:
        kuhn = pickle.load(f)  # MARS's own file: unpickle only files you trust
    with gzip.open(leduc_path, "rb") as f:
        leduc = leduc_table_policy(pickle.load(f))
    print(f"kuhn_poker  MARS cfr.pkl.gz  {exploitability(pyspiel.load_game('kuhn_poker'), kuhn):.3g}")
    print(f"kuhn_poker  ours (CFR 2000)  {equilibrium_policy('kuhn_poker').exploitability:.3g}")
    print(f"leduc_poker MARS ne.pkl.gz   {exploitability(pyspiel.load_game('leduc_poker'), leduc):.3g}")
    print(f"leduc_poker ours (CFR+ 1000) {equilibrium_policy('leduc_poker').exploitability:.3g}")


WHERE = (
    "the two files come from a clone of MARS (github.com/thu-nics/MARS): "
    "git -C MARS show HEAD:roll/agentic/env/kuhn_poker/cfr.pkl.gz > kuhn_cfr.pkl.gz; "
    "git -C MARS show HEAD:roll/agentic/env/leduc_poker/ne.pkl.gz > leduc_ne.pkl.gz"
)


def check_inputs(args: list[str]) -> str | None:
    """One line saying what is wrong with the arguments (None: two files that exist)."""
    if len(args) != 2:
        return f"usage: compare_equilibria.py KUHN_CFR.pkl.gz LEDUC_NE.pkl.gz; {WHERE}"
    missing = [a for a in args if not Path(a).is_file()]
    if missing:
        return f"not found: {', '.join(missing)}; {WHERE}"
    return None


if __name__ == "__main__":
    problem = check_inputs(sys.argv[1:])
    if problem:
        sys.exit(problem)
    main(*sys.argv[1:3])
