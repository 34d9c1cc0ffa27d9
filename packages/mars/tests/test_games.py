"""A game's facts live on its class (`palaestra.mars.games`): checked against OpenSpiel's own game types, and a
new game is one class and one registration that the env and the evaluation then read."""

from __future__ import annotations

import pyspiel
import pytest

from palaestra.mars.env import GameEnv, render_response
from palaestra.mars.eval import GameEvalConfig, game_opponents
from palaestra.mars.games import GAMES, GameKind, make_game
from palaestra.mars.poker_games import KuhnPoker


@pytest.mark.parametrize("name", GAMES.names())
def test_facts_agree_with_openspiel(name):
    game = make_game(name)
    kind = pyspiel.load_game(game.openspiel_name, dict(game.params)).get_type()
    assert game.name == name and isinstance(game.kind, GameKind)
    assert game.has_chance == (kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC)
    assert game.perfect_information == (kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION)
    # the facts the package reads: board games have no chance and full information, poker and Hanabi both
    board = name in ("tic_tac_toe", "connect_four")
    assert (game.kind == GameKind.board) == board == game.perfect_information == (not game.has_chance)
    assert (game.solver is not None) == (name in ("kuhn_poker", "leduc_poker"))
    assert game.cooperative == name.endswith("hanabi") and game.num_players == 2
    assert game.mean_moves > 0 and bool(game.mcts_seconds) == board


def test_opponents_follow_the_games_facts():
    cfg = GameEvalConfig(opponents=["random", "mcts", "equilibrium"])
    assert [o for o, _, _ in game_opponents(cfg, "tic_tac_toe")] == ["random", "mcts"]
    assert [o for o, _, _ in game_opponents(cfg, "leduc_poker")] == ["random", "equilibrium"]
    assert game_opponents(cfg, "mini_hanabi") == []


class _UnsolvedKuhn(KuhnPoker):
    """A new game: Kuhn poker's text, without a reference solver."""

    name = "unsolved_kuhn"
    solver = None


def test_a_new_game_is_one_class_and_one_registration():
    GAMES.register("unsolved_kuhn", _UnsolvedKuhn)
    try:
        env = GameEnv("unsolved_kuhn")
        env.reset(seed=0)
        step = env.step(render_response("<BET>"))
        assert not step.info.get("format_error") and env.env_type == "unsolved_kuhn"
        cfg = GameEvalConfig(opponents=["random", "equilibrium"])
        assert [o for o, _, _ in game_opponents(cfg, "unsolved_kuhn")] == ["random"]  # no solver: no equilibrium
    finally:
        GAMES.unregister("unsolved_kuhn")


@pytest.mark.parametrize("name", ["kuhn_poker", "leduc_poker"])
def test_uniform_exploitability_is_openspiels(name):
    """The scale printed beside a read-off exploitability, against OpenSpiel's Python uniform policy."""
    from open_spiel.python.algorithms.exploitability import exploitability
    from open_spiel.python.policy import UniformRandomPolicy

    from palaestra.mars.solvers import uniform_exploitability

    game = pyspiel.load_game(name)
    assert uniform_exploitability(name) == pytest.approx(exploitability(game, UniformRandomPolicy(game)), abs=1e-9)
