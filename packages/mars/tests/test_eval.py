"""Evaluation: opponents, equilibria, confidence intervals, the mars.eval job in MLflow."""

from __future__ import annotations

import math

import pytest

from palaestra.mars.eval import GameEvalConfig, evaluate
from palaestra.mars.games import make_game
from palaestra.mars.play import play_episodes
from palaestra.mars.players import MCTSPlayer, RandomPlayer
from palaestra.mars.solvers import equilibrium_policy, table_exploitability
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.stats import bootstrap_mean_interval, wilson_interval


def test_wilson_interval_reference_values():
    # Wilson 95% interval for 8/10 (reference: Newcombe 1998 / statsmodels proportion_confint(method="wilson"))
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    lo, hi = bootstrap_mean_interval([1.0] * 50 + [0.0] * 50)
    assert lo < 0.5 < hi and hi - lo < 0.3


def test_kuhn_equilibrium_exploitability(tmp_path):
    eq = equilibrium_policy("kuhn_poker", iterations=500, cache_dir=tmp_path)
    assert eq.exploitability < 0.01
    assert (tmp_path / "kuhn_poker_cfr_500.json").is_file()
    again = equilibrium_policy("kuhn_poker", iterations=500, cache_dir=tmp_path)  # from the cache
    assert again.table == eq.table
    # the uniform policy's exploitability in Kuhn poker is 11/24 (Lanctot's CFR notes; OpenSpiel tests)
    uniform = {k: [(a, 1 / len(v)) for a, _ in v] for k, v in eq.table.items()}
    assert table_exploitability("kuhn_poker", uniform) == pytest.approx(11 / 24, abs=1e-6)
    with pytest.raises(ValueError, match="available for: kuhn_poker, leduc_poker"):
        equilibrium_policy("tic_tac_toe", cache_dir=tmp_path)


@pytest.mark.parametrize("game_name", ["tic_tac_toe", "connect_four"])
def test_mcts_player_is_marss_bot(game_name):
    """MARS's opponent (roll/agentic/env/*/env.py): MCTSBot(uct_c 2, 100 sims, RandomRolloutEvaluator(10),
    solve=False) on one RandomState; ours picks the same moves from the same seed."""
    import numpy as np
    import pyspiel
    from open_spiel.python.algorithms import mcts

    from palaestra.mars.env import GameEnv

    game = make_game(game_name)
    player = MCTSPlayer(game, max_simulations=20, seed=3)
    assert player.bot.solve is False and player.bot.evaluator.n_rollouts == 10
    rng = np.random.RandomState(3)
    reference = mcts.MCTSBot(
        pyspiel.load_game(game_name), 2.0, 20, mcts.RandomRolloutEvaluator(10, rng), solve=False, random_state=rng
    )
    env = GameEnv(game_name)
    env.reset(0)
    for _ in range(3):
        expected = reference.step(env.state)
        text = player.act(env)
        assert text.endswith(f"<answer>{game.action_string(env.state, env.current_player, expected)}</answer>")
        env.step_action(expected)


def test_mcts_beats_random_at_tic_tac_toe():
    game = make_game("tic_tac_toe")
    results = play_episodes("tic_tac_toe", [MCTSPlayer(game, max_simulations=100), RandomPlayer(1)], list(range(20)))
    wins = sum(r.winner == 0 for r in results)
    losses = sum(r.winner == 1 for r in results)
    assert wins >= 15 and losses <= 1
    assert all(r.format_loser is None for r in results)


def test_eval_job_logs_metrics_and_plot(tracking, tmp_path):
    import mlflow

    cfg = load_config(
        {
            "job": "mars.eval",
            "policy": "random",
            "games": ["kuhn_poker", "mini_hanabi"],
            "opponents": ["random", "equilibrium"],
            "episodes": 30,
            "equilibrium_iterations": 200,
            "cache_dir": str(tmp_path / "cache"),
            "tracking": vars(tracking),
        }
    )
    out = run_job(cfg)
    client = mlflow.tracking.MlflowClient(tracking.uri)
    run = client.get_run(out["run_id"])
    m = run.data.metrics
    for seat in ("first", "second"):
        for opp in ("random", "equilibrium"):
            key = f"eval/kuhn_poker/{seat}/{opp}/win_rate"
            assert key in m and m[f"{key}_lo"] <= m[key] <= m[f"{key}_hi"]
    # both seats pooled: twice the episodes, the win rate the mean of the two seats' (equal episode counts)
    both = "eval/kuhn_poker/both/random"
    assert m[f"{both}/episodes"] == 60
    seat_mean = (m["eval/kuhn_poker/first/random/win_rate"] + m["eval/kuhn_poker/second/random/win_rate"]) / 2
    assert m[f"{both}/win_rate"] == pytest.approx(seat_mean)
    assert m[f"{both}/win_rate_lo"] <= m[f"{both}/win_rate"] <= m[f"{both}/win_rate_hi"]
    assert m["eval/kuhn_poker/equilibrium_exploitability"] < 0.05
    assert "eval/mini_hanabi/selfplay/self/mean_return" in m
    artifacts = {a.path for a in client.list_artifacts(out["run_id"])}
    assert {"eval_results.json", "eval_plot.png"} <= artifacts
    # random vs the equilibrium in Kuhn loses on average (the equilibrium's value vs uniform is positive)
    assert not math.isnan(m["eval/kuhn_poker/first/equilibrium/mean_return"])


def test_eval_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="known games"):
        evaluate(GameEvalConfig(games=["chess"], policy="random"))
    with pytest.raises(ConfigError, match="opponents: unknown opponent 'alphazero'"):
        evaluate(GameEvalConfig(opponents=["alphazero"], policy="random"))


def test_engine_path_with_a_legal_scripted_llm():
    """Through the shared rollout engine: a player that always answers a legal move never format-loses,
    and its results match what OpenSpiel says of the recorded games."""
    from palaestra.mars.engine_eval import engine_episodes
    from palaestra.mars.scripted_llm import ScriptedLegalClient
    from palaestra.shared.rollout.engine import RolloutConfig

    client = ScriptedLegalClient(seed=0)
    rollout = RolloutConfig(max_turns=50, max_tokens_per_turn=32, max_context_tokens=4096)
    for game, seat in (("tic_tac_toe", 1), ("kuhn_poker", 0), ("mini_hanabi", None)):
        results, stats = engine_episodes(
            client,
            rollout,
            game,
            list(range(6)),
            seat,
            RandomPlayer(3),
            prompt="compact" if game == "tic_tac_toe" else "full",
        )
        assert len(results) == 6 and stats["failed"] == 0
        assert all(r.format_loser is None for r in results)
        for r in results:
            if seat is not None:
                assert r.returns[0] == -r.returns[1]  # zero-sum payoffs from OpenSpiel
                assert r.winner == (-1 if r.returns[0] == 0 else int(r.returns[1] > 0))


def test_eval_llm_policy_through_the_engine(tiny_llm):
    cfg = GameEvalConfig(
        games=["tic_tac_toe"], policy="llm", opponents=["random"], episodes=4, max_tokens=8, prompt="compact"
    )
    metrics, records = evaluate(cfg, clients={repr(cfg.llm): tiny_llm})
    assert [r["seat"] for r in records] == ["first", "second", "both"]
    # an untrained random-weight model does not write the answer format: it loses every game by format
    assert metrics["eval/tic_tac_toe/first/random/format_loss_rate"] == 1.0
    assert metrics["eval/tic_tac_toe/second/random/loss_rate"] == 1.0


def test_eval_headline_prefers_pooled_seats_vs_random():
    from palaestra.mars.eval import eval_headline

    def setting(prefix, k, n):
        lo, hi = wilson_interval(k, n)
        return {
            f"{prefix}/win_rate": k / n,
            f"{prefix}/win_rate_lo": lo,
            f"{prefix}/win_rate_hi": hi,
            f"{prefix}/episodes": n,
        }

    after = {**setting("eval/tic_tac_toe/first/mcts", 1, 10), **setting("eval/tic_tac_toe/both/random", 53, 100)}
    before = setting("eval/tic_tac_toe/both/random", 44, 100)
    line = eval_headline(after, before)
    # 53/100: Wilson 95% [0.433, 0.625]; 44/100: [0.347, 0.538] (closed form, z = 1.96)
    assert line == (
        "tic_tac_toe win rate vs random (both seat) 0.53 [0.43, 0.62] "
        "(before 0.44 [0.35, 0.54]; 95% Wilson, 100 episodes)"
    )
    assert eval_headline({}) is None
