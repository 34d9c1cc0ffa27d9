"""packages/mars/scripts/kuhn_flow.py: its exploitability and self-play gradient against independent computations."""

import importlib.util
from pathlib import Path

import numpy as np
import pyspiel
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kuhn_flow.py"


@pytest.fixture(scope="module")
def flow():
    spec = importlib.util.spec_from_file_location("kuhn_flow", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _policy_gradient(bet: np.ndarray) -> np.ndarray:
    """d f / d bet_c by the policy-gradient theorem, walking the tree once: at every decision of a player holding
    card c, the reach probability of the history times (Q(bet) - Q(pass)) for the player acting; with one policy
    in both seats this is the sum of both seats' derivatives."""
    game = pyspiel.load_game("kuhn_poker")
    grad = np.zeros(3)

    def value(state, reach: float) -> np.ndarray:  # both players' expected returns from `state`
        if state.is_terminal():
            return np.array(state.returns())
        if state.is_chance_node():
            return sum(p * value(state.child(a), reach * p) for a, p in state.chance_outcomes())
        player = state.current_player()
        card = int(state.information_state_string(player)[0])
        q = [value(state.child(a), reach * p) for a, p in ((0, 1 - bet[card]), (1, bet[card]))]
        grad[card] += reach * (q[1][player] - q[0][player])
        return (1 - bet[card]) * q[0] + bet[card] * q[1]

    value(game.new_initial_state(), 1.0)
    return grad


@pytest.mark.parametrize("bet", [(0.5, 0.5, 0.5), (0.1, 0.1, 0.8), (0.3, 0.3, 0.8), (0.23, 0.61, 0.92)])
def test_selfplay_gradient_equals_the_policy_gradient_theorem(flow, bet):
    bet = np.array(bet)
    assert flow.selfplay_gradient(bet) == pytest.approx(_policy_gradient(bet), abs=1e-6)


def test_exploitability_of_reference_policies(flow):
    from open_spiel.python.algorithms import exploitability

    uniform = exploitability.exploitability(flow.GAME, flow.card_policy(np.array([0.5, 0.5, 0.5])))
    assert uniform == pytest.approx(11 / 24)  # the uniform Kuhn policy: 0.4583 (OpenSpiel's own tests)
    # the rule of thumb built another way: OpenSpiel's callable-to-table, the card from the deal (history[player])
    from open_spiel.python import policy as policy_lib

    bet = {0: 0.3, 1: 0.3, 2: 0.8}
    direct = policy_lib.tabular_policy_from_callable(
        flow.GAME,
        lambda state: {
            0: 1 - bet[state.history()[state.current_player()]],
            1: bet[state.history()[state.current_player()]],
        },
    )
    path = flow.flow(np.array([0.3, 0.3, 0.8]), time=20, every=10)
    assert [t for t, _, _ in path] == [0, 10, 20]
    assert path[0][1] == pytest.approx(exploitability.exploitability(flow.GAME, direct), abs=1e-12)
    assert path[-1][1] < path[0][1]  # the recorded prediction: the flow falls from this start


def test_king_only_script_scores_known_policies():
    """scripts/kuhn_king_only.py's exploitability against known values: the uniform policy 11/24, and 0 for
    Kuhn's equilibrium with alpha = 0 (player 0 never bets first, calls a bet with Q 1/3 and K; player 1 bets J 1/3
    and K after a pass, calls with Q 1/3 and K), written as one table over both seats' information states."""
    spec = importlib.util.spec_from_file_location("kuhn_king_only", SCRIPT.parent / "kuhn_king_only.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.kuhn_exploitability([0.5] * 12) == pytest.approx(11 / 24)
    # the equilibrium with alpha = 0, one table for both seats (their states do not overlap in Kuhn)
    eq = {"0": 0, "1": 0, "2": 0, "0p": 1 / 3, "1p": 0, "2p": 1, "0b": 0, "1b": 1 / 3, "2b": 1}
    eq |= {"0pb": 0, "1pb": 1 / 3, "2pb": 1}
    assert module.kuhn_exploitability([eq[s] for s in module.STATES]) == pytest.approx(0.0, abs=1e-12)
