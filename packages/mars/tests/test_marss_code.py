"""Rules of MARS's code (github thu-nics/MARS) that the mars package offers, each checked against a
re-implementation of MARS's code as written, written here from its source (not from this package's output).

- rewards that reach a seat before its first turn: ``roll/agentic/rollout/env_manager.py`` ``_log_env_state``;
- batch composition: ``roll/agentic/rollout/rollout_scheduler.py`` ``get_batch`` and ``env_manager.py``
  ``run_rollout_loop`` (each env plays up to ``max_traj_per_env`` episodes; the batch is the first rows to
  arrive);
- the paper config's optimizer steps and schedule: ``roll/pipeline/agentic/agentic_config.py``
  ``set_max_steps``, ``roll/distributed/strategy/megatron_strategy.py``, ``roll/pipeline/base_worker.py``
  ``train_step``, ``examples/multi_games/agentic_val_multi_games_selfplay.yaml``.
"""

from __future__ import annotations

import pyspiel
import pytest

from palaestra.mars.env import GameEnv, Shaping
from palaestra.mars.games import make_game
from palaestra.shared.rl.advantages import AdvantageInput


def _marss_turn_rewards(game: pyspiel.Game, history: list[int]) -> dict[int, list[float]]:
    """Per seat, the reward of each of its turns as MARS's env manager records them in self-play.

    ``_log_env_state``: the acting seat's last history entry (the state it acted on) gets the step's reward for
    it; the other seat's last entry gets the step's reward for that seat *only if its history is not empty*;
    then, if the game goes on, the next seat's history gets the new state. Seat 0's history starts with the
    reset state, seat 1's is empty until seat 0 has moved. A step's reward is the change of OpenSpiel's returns
    over the move and the chance outcomes (Hanabi draws) after it; the test turns MARS's shaping off."""
    histories: dict[int, list[dict]] = {0: [{}], 1: []}
    state, i, pending = game.new_initial_state(), 0, False
    while i < len(history) and state.is_chance_node():
        state.apply_action(history[i])
        i += 1
    while i < len(history):
        player = state.current_player()
        if pending:  # the state after the previous move goes to the seat that acts on it
            histories[player].append({})
        before = state.returns()
        state.apply_action(history[i])
        i += 1
        while i < len(history) and state.is_chance_node():
            state.apply_action(history[i])
            i += 1
        rewards = [a - b for a, b in zip(state.returns(), before)]
        histories[player][-1]["reward"] = histories[player][-1].get("reward", 0.0) + rewards[player]
        histories[player][-1]["action"] = True
        other = 1 - player
        if histories[other]:
            histories[other][-1]["reward"] = histories[other][-1].get("reward", 0.0) + rewards[other]
        pending = not state.is_terminal()
    return {p: [e["reward"] for e in h if "action" in e] for p, h in histories.items()}


def _play_random_selfplay(game: str, pre_turn_rewards: str, episodes: int):
    from palaestra.mars.scripted_llm import ScriptedLegalClient
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    shaping = Shaping(valid_turn_bonus=0.0, draw_bonus=0.0, pre_turn_rewards=pre_turn_rewards)
    specs = [
        EpisodeSpec(lambda: GameEnv(game, shaping, prompt="compact"), seed=i, group_id=str(i)) for i in range(episodes)
    ]
    cfg = RolloutConfig(max_tokens_per_turn=64, max_turns=200, max_context_tokens=1 << 20, stop=["</answer>"])
    return RolloutEngine(ScriptedLegalClient(seed=0), cfg).run(specs, seed=0).trajectories


def test_rewards_before_a_seats_first_turn_follow_marss_env_manager_on_mini_hanabi():
    """Real mini Hanabi games (random legal play through the rollout engine): with ``drop`` (the default, MARS's)
    every seat's turn rewards, as the advantage input sees them, equal MARS's env manager's record of the same
    game; with ``report`` they differ exactly where seat 1 received a reward before its first turn."""
    game = make_game("mini_hanabi").openspiel
    n = 60
    differing = 0
    for rule in ("drop", "report"):
        trajs = _play_random_selfplay("mini_hanabi", rule, n)
        assert len(trajs) == 2 * n and not any(t.failed for t in trajs)
        adv_in = AdvantageInput.from_trajectories(trajs)
        for t, rewards in zip(trajs, adv_in.turn_rewards):
            history = t.info["final"]["history"]
            seat = int(t.agent.split("_")[1])
            marss = _marss_turn_rewards(game, history)[seat]
            assert len(marss) == len(t.turns)
            if rule == "drop":
                assert list(rewards) == pytest.approx(marss)
                assert t.extra_reward == 0.0
            elif list(rewards) != pytest.approx(marss):
                differing += 1
                assert seat == 1 and t.extra_reward != 0.0
                assert rewards[0] == pytest.approx(marss[0] + t.extra_reward)
                assert list(rewards[1:]) == pytest.approx(marss[1:])
    # seat 0's first card often scores before seat 1 has moved: the two rules differ on real games
    assert differing >= n // 10


def test_pre_turn_rewards_is_checked():
    with pytest.raises(ValueError, match="pre_turn_rewards"):
        Shaping(pre_turn_rewards="credit")
