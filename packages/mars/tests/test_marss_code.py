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

from pathlib import Path

import pyspiel
import pytest

from palaestra.mars.env import GameEnv, Shaping
from palaestra.mars.games import make_game
from palaestra.shared.rl.advantages import AdvantageInput

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "mars"


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


def _play_random_selfplay(game: str, episodes: int):
    from palaestra.mars.scripted_llm import ScriptedLegalClient
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    shaping = Shaping(valid_turn_bonus=0.0, draw_bonus=0.0)
    specs = [
        EpisodeSpec(lambda: GameEnv(game, shaping, prompt="compact"), seed=i, group_id=str(i)) for i in range(episodes)
    ]
    cfg = RolloutConfig(max_tokens_per_turn=64, max_turns=200, max_context_tokens=1 << 20, stop=["</answer>"])
    return RolloutEngine(ScriptedLegalClient(seed=0), cfg).run(specs, seed=0)


def test_rewards_before_a_seats_first_turn_follow_marss_env_manager_on_mini_hanabi():
    """Real mini Hanabi games (random legal play through the rollout engine), credited by mars.train's batch
    rule: with ``drop`` (MARS's, the paper config's) every seat's turn rewards, as the advantage input sees
    them, equal MARS's env manager's record of the same game; with ``report`` (the default) they differ
    exactly where seat 1 received a reward before its first turn, which the env returns."""
    from types import SimpleNamespace

    from palaestra.mars.batching import MarsBatch, MarsRows

    game = make_game("mini_hanabi").openspiel
    n = 60
    played = _play_random_selfplay("mini_hanabi", n)
    assert len(played.trajectories) == 2 * n and not any(t.failed for t in played.trajectories)
    assert sum(t.extra_reward != 0.0 for t in played.trajectories) >= n // 10  # the env drops nothing
    differing = 0
    for rule in ("drop", "report"):
        cfg = SimpleNamespace(batch=MarsBatch(pre_turn_rewards=rule), seed=0)
        trajs = MarsRows(cfg, tasks=None).select(0, played).trajectories
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
    assert any(t.extra_reward for t in played.trajectories)  # crediting copies rows, never edits the rollout's


def test_pre_turn_rewards_is_checked():
    from palaestra.shared.config import ConfigError
    from palaestra.shared.jobs import load_config

    with pytest.raises(ConfigError, match="pre_turn_rewards"):
        load_config({"job": "mars.train", "batch": {"pre_turn_rewards": "credit"}})


# -- batch composition ------------------------------------------------------------------------------------------


def _rolls_get_batch(episodes, rows: int, clock: str):
    """ROLL's scheduler as written, simulated in time: every environment runs ``run_rollout_loop`` (play an
    episode, put one rollout per seat with a non-empty history on the output queue in seat order, reset, stop
    after ``max_traj_per_env`` episodes); ``get_batch`` waits until at least `rows` rows have arrived (one per
    completed traj group: group_size 1), stops the environments and returns ``collect_data[:rows]`` in arrival
    order. Environments run at the same speed; an episode lasts its clock (generated tokens or model calls);
    simultaneous arrivals in environment order."""
    import heapq

    def duration(trajs):
        if clock == "turns":
            return sum(len(t.turns) for t in trajs)
        return sum(len(turn.response_ids) for t in trajs for turn in t.turns)

    events = [(duration(played[0]), env, 0) for env, played in enumerate(episodes) if played]
    heapq.heapify(events)
    queue = []
    while events and len(queue) < rows:
        now, env, k = heapq.heappop(events)
        for seat in (0, 1):  # formulate_rollouts: for player_id in [0, 1], if that player's history is not empty
            queue += [t for t in episodes[env][k] if t.agent == f"player_{seat}" and t.turns]
        if k + 1 < len(episodes[env]):
            heapq.heappush(events, (now + duration(episodes[env][k + 1]), env, k + 1))
    return queue[:rows]


def _fake_episode(rng, slot, k):
    from palaestra.shared.rollout.trajectory import Trajectory, Turn

    trajs = []
    for seat in (0, 1):
        turns = [Turn(f"player_{seat}", [1], [2] * rng.randint(1, 40)) for _ in range(rng.randint(0 if seat else 1, 5))]
        trajs.append(Trajectory("g", f"player_{seat}", f"{slot}-{k}", turns))
    return trajs


@pytest.mark.parametrize("clock", ["tokens", "turns"])
def test_first_finished_is_rolls_get_batch(clock):
    """`first_finished` keeps the rows ROLL's scheduler would return, in its order (random episode lengths, seats
    that never acted included)."""
    import random

    from palaestra.mars.batching import first_finished

    rng = random.Random(3)
    for _ in range(20):
        slots, per_slot = rng.randint(1, 12), rng.randint(1, 4)
        episodes = [[_fake_episode(rng, s, k) for k in range(per_slot)] for s in range(slots)]
        rows = rng.randint(1, 2 * slots * per_slot)
        got = first_finished(episodes, rows, clock)
        assert [id(t) for t in got] == [id(t) for t in _rolls_get_batch(episodes, rows, clock)]


def test_first_finished_rollouts_on_real_games_lean_toward_fast_games():
    """Real games through the rollout engine, MARS's layout shrunk (4 environments per game, ceil(24 / 12) = 2
    episodes each, 24 rows): the rows kept are ROLL's, and Kuhn poker (2-3 moves) fills more than its third."""
    from palaestra.mars.batching import FirstFinished, MarsBatch, slot_envs
    from palaestra.mars.scripted_llm import ScriptedLegalClient
    from palaestra.mars.train import GameWeight, MarsTrainConfig
    from palaestra.shared.rl.config import EnvSpec
    from palaestra.shared.rl.episodes import make_env
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
    from palaestra.shared.rollout.workers import LocalRollouts

    games = [
        EnvSpec("mars_game", {"game": g, "prompt": "compact"}) for g in ("tic_tac_toe", "kuhn_poker", "mini_hanabi")
    ]
    slots = slot_envs(games, [4, 4, 4])
    specs = [
        EpisodeSpec(lambda e=e: make_env(e.name, dict(e.kwargs)), 100 * s + k, f"0-{s}-{k}")
        for s, e in enumerate(slots)
        for k in range(2)
    ]
    cfg = RolloutConfig(max_tokens_per_turn=64, max_turns=200, max_context_tokens=1 << 20, stop=["</answer>"])
    played = LocalRollouts(ScriptedLegalClient(seed=0), cfg).run(specs, seed=0).trajectories
    inner = LocalRollouts(ScriptedLegalClient(seed=0), cfg)  # the same games again
    batch = MarsBatch("first_finished", [4, 4, 4], episodes_per_slot=2, clock="turns")
    mars = MarsTrainConfig(games=[GameWeight(g) for g in ("tic_tac_toe", "kuhn_poker", "mini_hanabi")], batch=batch)
    mars.rollout.group_size, mars.tasks_per_step = 1, 12  # 24 rows
    kept = FirstFinished(mars).select(0, inner.run(specs, seed=0)).trajectories
    assert len(kept) == 24
    by_group = {}
    for t in played:
        by_group.setdefault(t.group_id, []).append(t)
    episodes = [[by_group[f"0-{s}-{k}"] for k in range(2)] for s in range(12)]
    expected = _rolls_get_batch(episodes, 24, "turns")
    assert [(t.group_id, t.agent) for t in kept] == [(t.group_id, t.agent) for t in expected]
    kuhn = sum(t.env_type == "kuhn_poker" for t in kept)
    assert kuhn > 24 / 3


def test_slot_counts_are_checked():
    from palaestra.mars.batching import slot_envs
    from palaestra.shared.config import ConfigError
    from palaestra.shared.rl.config import EnvSpec

    with pytest.raises(ConfigError, match="batch.env_slots"):
        slot_envs([EnvSpec("mars_game")] * 3, [32, 32])


# -- the paper config ------------------------------------------------------------------------------------------

# MARS's multi-game self-play run, restated from examples/multi_games/agentic_val_multi_games_selfplay.yaml
MARS_RUN = {
    "max_steps": 200,
    "rollout_batch_size": 384,
    "num_return_sequences": 1,
    "ppo_epochs": 1,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "gpus": 8,  # actor_train device_mapping list(range(0, 8))
    "tensor_model_parallel_size": 4,
    "pipeline_model_parallel_size": 1,
    "warmup_steps": 10,
    "env_groups": [32, 32, 32],  # train_env_manager n_groups: TicTacToe, KuhnPoker, MiniHanabi
    "group_size": 1,
}


def _marss_optimizer_steps():
    """ROLL's counts, as its code computes them: ``agentic_config.py`` ``set_max_steps`` (max_steps x rows //
    backward batch), then ``megatron_strategy.py`` divides by the data-parallel size; ``base_worker.py``
    ``train_step`` makes one optimizer step per backward batch of each rank's share of the rows."""
    m = MARS_RUN
    dp = m["gpus"] // (m["tensor_model_parallel_size"] * m["pipeline_model_parallel_size"])
    backward = m["per_device_train_batch_size"] * m["gradient_accumulation_steps"]
    rows = m["rollout_batch_size"] * m["num_return_sequences"]
    scheduler_steps = m["max_steps"] * (rows * m["ppo_epochs"] // backward) // dp
    per_rl_step = (rows // dp) * m["ppo_epochs"] // backward
    return dp, per_rl_step, scheduler_steps


def test_roll_ends_its_cosine_at_the_last_optimizer_step():
    dp, per_rl_step, scheduler_steps = _marss_optimizer_steps()
    assert (dp, per_rl_step) == (2, 48)
    assert scheduler_steps == MARS_RUN["max_steps"] * per_rl_step  # the schedule's length is the run's


def test_paper_config_runs_marss_learning_rule():
    from palaestra.shared.jobs import load_config

    cfg = load_config(EXPERIMENTS / "qwen3_4b.yaml")
    dp, per_rl_step, _ = _marss_optimizer_steps()
    rows = cfg.tasks_per_step * cfg.rollout.group_size * 2  # two seats per self-play episode
    assert rows == MARS_RUN["rollout_batch_size"] and cfg.steps == MARS_RUN["max_steps"]
    assert cfg.ppo_epochs == MARS_RUN["ppo_epochs"]
    assert rows // cfg.minibatch_size == per_rl_step and rows % cfg.minibatch_size == 0
    assert [a.name for a in cfg.advantages] == ["mars_code_norm"]
    assert cfg.batch.pre_turn_rewards == "drop"
    assert cfg.batch.rule == "first_finished" and list(cfg.batch.env_slots) == MARS_RUN["env_groups"]
    slots = sum(cfg.batch.env_slots)
    assert cfg.batch.episodes_per_slot in (0, -(-rows // slots))  # ROLL's max_traj_per_env: ceil(384 / 96) = 4
    assert cfg.rollout.group_size == MARS_RUN["group_size"]
    assert cfg.optim.warmup_steps == MARS_RUN["warmup_steps"]
    assert cfg.optim.schedule_unit == "optimizer_step"
    # MARS's loss: k3 KL clamped to [-10, 10] (functionals.py compute_approx_kl), log-probs at T 1
    assert cfg.loss.kl_clamp == 10 and cfg.loss.logprob_temperature == 1.0
    # MARS's mask: "<think>\n" put back into the assistant message (env_manager.py get_env_input), so trained
    assert cfg.rollout.response_prefix == "<think>\n" and cfg.rollout.response_prefix_in_loss


def _megatron_lr(num_steps: int, max_lr: float, warmup: int, decay_steps: int, min_lr: float = 0.0) -> float:
    """Megatron's ``OptimizerParamScheduler.get_lr`` (cosine style, init_lr 0), which MARS's
    ``mcore_adapter`` ``get_megatron_lr_scheduler`` builds for ``cosine_with_min_lr``: linear warmup while
    num_steps <= warmup, then a cosine from max_lr to min_lr over decay_steps - warmup. The scheduler starts
    at num_steps 0 and steps once after every optimizer step, so optimizer step j runs at num_steps j."""
    import math

    if warmup > 0 and num_steps <= warmup:
        return max_lr * num_steps / warmup
    if num_steps > decay_steps:
        return min_lr
    ratio = (num_steps - warmup) / (decay_steps - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)


def test_paper_config_learning_rate_is_marss_at_every_optimizer_step():
    from palaestra.shared.jobs import load_config
    from palaestra.shared.rl.optim import optimizer_steps, step_learning_rate

    cfg = load_config(EXPERIMENTS / "qwen3_4b.yaml")
    _, per_rl_step, scheduler_steps = _marss_optimizer_steps()
    assert optimizer_steps(cfg, 2 * cfg.tasks_per_step) == per_rl_step
    for j in range(scheduler_steps):
        ours = step_learning_rate(cfg, step=j // per_rl_step, steps=cfg.steps, k=j % per_rl_step, per_step=per_rl_step)
        marss = _megatron_lr(j, 1e-6, MARS_RUN["warmup_steps"], scheduler_steps)
        assert ours == pytest.approx(marss, rel=1e-9, abs=1e-18), j


# -- prompts ------------------------------------------------------------------------------------------------------

# MARS's FORMAT_PROMPT_EXAMPLE per game and seat (roll/agentic/env/*/env.py _get_prefix_prompt); Hanabi's is
# spelled as this package's legal action strings ("<Discard card 0>")
MARS_EXAMPLES = {
    "tic_tac_toe": ("<X(0,0)>", "<O(0,0)>"),
    "connect_four": ("<X(3)>", "<O(3)>"),
    "kuhn_poker": ("<PASS>", "<PASS>"),
    "leduc_poker": ("<CALL>", "<CALL>"),
    "mini_hanabi": ("<Discard card 0>", "<Discard card 0>"),
}
# how MARS's PLAYER INFORMATION writes the legal actions (point 2c; Hanabi's point 3-4: card and stack notation)
MARS_ACTION_FORMATS = {
    "tic_tac_toe": ("<X({row},{column})>", "<O({row},{column})>"),
    "connect_four": ("<X({column})>", "<O({column})>"),
    "kuhn_poker": ("<PASS>", "<BET>"),
    "leduc_poker": ("<FOLD>", "<CALL>", "<RAISE>"),
    "mini_hanabi": ("'R2'", "'Y0'"),
}


def _first_message(game: str, seat: int, **kwargs) -> tuple[str, str]:
    env = GameEnv(game, prompt="full", **kwargs)
    env.reset(0)
    if seat == 1:
        env.step_action(env.state.legal_actions()[0])
    system, user = env.observe(env.current_agent)
    return system["content"], user["content"]


@pytest.mark.parametrize("game", sorted(MARS_EXAMPLES))
def test_full_prompt_gives_marss_information_and_format(game):
    for seat in (0, 1):
        _, user = _first_message(game, seat)
        rules, rest = user.split("\n\nPLAYER INFORMATION:\n", 1)
        information, rest = rest.split("\n\nRESPONSE INSTRUCTIONS:\n", 1)
        instructions = rest.split("\n\nInformation of Turn-", 1)[0]
        # MARS's format: the answer tag alone after the thinking (the response starts inside <think>), its example
        assert "<answer>{your chosen action}</answer>" in instructions and "<think>" not in instructions
        assert f"<answer>{MARS_EXAMPLES[game][seat]}</answer>" in instructions
        assert "concise" in instructions
        assert f"player_{seat}" in information or f"mark {'XO'[seat]}" in information
        for pattern in MARS_ACTION_FORMATS[game]:
            if game in ("tic_tac_toe", "connect_four") and pattern[1] != "XO"[seat]:
                continue  # each seat is told its own mark's pattern
            assert pattern in information, pattern
    if game == "mini_hanabi":  # MARS's rule 8c: losing every life token ends the game with a score of 0
        assert "score 0" in rules


def _marss_board(state) -> str:
    """MARS's tic-tac-toe / Connect Four ``_render_text``: OpenSpiel's board, '.' -> '_', 'x' -> 'X', 'o' -> 'O'."""
    rows = str(state).strip().split("\n")
    return "\n".join("".join({".": "_", "x": "X", "o": "O"}.get(c, c) for c in row) for row in rows)


@pytest.mark.parametrize("game", ["tic_tac_toe", "connect_four"])
def test_board_game_state_is_marss_rendering(game):
    import random

    rng = random.Random(0)
    env = GameEnv(game, prompt="full")
    for episode in range(10):
        env.reset(episode)
        while not env.done:
            text = env.observe(env.current_agent)[-1]["content"]
            shown = text.rsplit("GAME STATE:\n", 1)[1].split("\n\nLEGAL ACTIONS:", 1)[0]
            assert shown == _marss_board(env.state)
            env.step_action(rng.choice(env.state.legal_actions()))


MARS_KUHN = {  # a lab's file: MARS's sections for Kuhn poker, with its literal braces and $ placeholders
    "kuhn_poker": {
        "system": "You are an AI agent that makes optimal decisions to win in the game of Kuhn Poker.",
        "player_information": "1. You are player_$player. You are competing with player_$other.",
        "response_instructions": "Output `<answer>{your chosen action}</answer>`. E.g. `<answer>$example</answer>`.",
    }
}


def test_prompt_file_replaces_the_sections_it_names(tmp_path):
    import yaml

    path = tmp_path / "mars_prompts.yaml"
    path.write_text(yaml.safe_dump(MARS_KUHN))
    system, user = _first_message("kuhn_poker", 1, prompt_file=str(path))
    assert system == MARS_KUHN["kuhn_poker"]["system"]
    assert "PLAYER INFORMATION:\n1. You are player_1. You are competing with player_0.\n\n" in user
    assert (
        "RESPONSE INSTRUCTIONS:\nOutput `<answer>{your chosen action}</answer>`. E.g. `<answer><PASS></answer>`."
        in user
    )
    _, default_user = _first_message("kuhn_poker", 1)
    rules = default_user.split("\n\nPLAYER INFORMATION:", 1)[0]
    assert user.startswith(rules + "\n\nPLAYER INFORMATION:")  # rules: not in the file, the project's text
    path.write_text(yaml.safe_dump({"kuhn_poker": {"rule": "typo"}}))
    from palaestra.mars.prompt_text import load_prompt_text

    load_prompt_text.cache_clear()
    with pytest.raises(ValueError, match="unknown section 'rule'"):
        GameEnv("kuhn_poker", prompt_file=str(path))


def test_prompt_file_reaches_training_sft_and_evaluation(tmp_path):
    import yaml

    from palaestra.mars.plugins import mars_legal_moves
    from palaestra.mars.train import _eval_config, game_env_specs
    from palaestra.shared.jobs import load_config

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(MARS_KUHN))
    cfg = load_config({"job": "mars.train", "prompt_file": str(path), "games": [{"game": "kuhn_poker"}]})
    assert all(e.kwargs["prompt_file"] == str(path) for e in game_env_specs(cfg))
    assert _eval_config(cfg).prompt_file == str(path)
    rows = mars_legal_moves(["kuhn_poker"], episodes=1, prompt_file=str(path))  # the SFT warm start's conversations
    assert rows and all(r["messages"][0]["content"] == MARS_KUHN["kuhn_poker"]["system"] for r in rows)


# -- evaluation --------------------------------------------------------------------------------------------------

# MARS's evaluation settings, restated from the val_env_manager tags of
# examples/multi_games/agentic_val_multi_games_selfplay.yaml (and examples/model_game_eval/agentic_rollout_eval.yaml):
# (game, seat of the model, opponent); "first" is opponent_player 1 (the default), "second" opponent_player 0
MARS_EVAL = {
    ("tic_tac_toe", "first", "mcts100"),
    ("tic_tac_toe", "second", "mcts100"),
    ("tic_tac_toe", "first", "mcts1000"),
    ("tic_tac_toe", "second", "mcts1000"),
    ("connect_four", "first", "mcts100"),
    ("connect_four", "second", "mcts100"),
    ("connect_four", "first", "mcts1000"),
    ("connect_four", "second", "mcts1000"),
    ("kuhn_poker", "first", "cfr"),
    ("kuhn_poker", "second", "cfr"),
    ("leduc_poker", "first", "ne"),
    ("leduc_poker", "second", "ne"),
    ("mini_hanabi", "selfplay", "self"),
    ("simple_hanabi", "selfplay", "self"),
    ("full_hanabi", "selfplay", "self"),
}
MARS_MCTS = {"uct_c": 2.0, "rollout_count": 10}  # roll/agentic/env/tictactoe/config.py, connect_four's the same
MARS_EQUILIBRIUM = {"cfr": "equilibrium", "ne": "equilibrium"}  # kuhn: cfr.pkl.gz (CFR), leduc: ne.pkl.gz


def test_paper_config_evaluates_as_mars():
    from palaestra.mars.eval import game_opponents
    from palaestra.mars.games import make_game
    from palaestra.mars.train import _eval_config
    from palaestra.shared.jobs import load_config

    cfg = load_config(EXPERIMENTS / "qwen3_4b.yaml")
    ev = _eval_config(cfg)
    settings = set()
    for game in ev.games:
        if make_game(game).cooperative:
            settings.add((game, "selfplay", "self"))
        for _, label, _ in game_opponents(ev, game):
            settings |= {(game, seat, label) for seat in ev.seats}
    expected = {(g, s, MARS_EQUILIBRIUM.get(o, o)) for g, s, o in MARS_EVAL}
    assert settings == expected
    assert (ev.mcts_uct_c, ev.mcts_rollouts, ev.mcts_solve) == (MARS_MCTS["uct_c"], MARS_MCTS["rollout_count"], False)
    # MARS evaluates with its training sampling, prefix and sequence (actor_infer.generating_args, sequence_length)
    r = cfg.rollout
    assert (ev.temperature, ev.top_p, ev.top_k) == (r.temperature, r.top_p, r.top_k) == (0.6, 0.99, 100)
    assert ev.response_prefix == r.response_prefix == "<think>\n"
    assert ev.max_tokens == r.max_tokens_per_turn == 4096 and ev.max_context_tokens == 32768
    assert ev.prompt == cfg.prompt and ev.shaping == cfg.shaping
    assert ev.mcts_on_ray  # MCTS-1000 replies in parallel on Ray (parallel_mcts.py)


def test_mcts_levels_play_each_strength(tmp_path):
    """`mcts_levels` plays one opponent per simulation count (scripted random policy, a few games)."""
    from palaestra.mars.eval import GameEvalConfig, evaluate

    cfg = GameEvalConfig(
        games=["tic_tac_toe", "kuhn_poker"],
        policy="random",
        opponents=["mcts", "equilibrium"],
        mcts_levels=[2, 5],
        episodes=2,
        cache_dir=str(tmp_path),
    )
    metrics, _ = evaluate(cfg)
    for label in ("mcts2", "mcts5"):
        assert f"eval/tic_tac_toe/both/{label}/win_rate" in metrics
        assert not any(f"kuhn_poker/first/{label}" in k for k in metrics)
    assert "eval/kuhn_poker/both/equilibrium/win_rate" in metrics
    assert not any("tic_tac_toe/first/equilibrium" in k for k in metrics)


def test_table_gives_base_trained_and_relative_change():
    from palaestra.mars.eval_table import compare, format_table

    def rec(game, seat, opponent, value, lo, hi):
        key = "mean_return" if opponent == "self" else "win_rate"
        return {"game": game, "seat": seat, "opponent": opponent, key: value, f"{key}_lo": lo, f"{key}_hi": hi}

    base = [
        rec("connect_four", "first", "mcts100", 0.2, 0.1, 0.3),
        rec("connect_four", "second", "mcts100", 0.1, 0.0, 0.2),
        rec("connect_four", "both", "mcts100", 0.15, 0.1, 0.2),
        rec("simple_hanabi", "selfplay", "self", 2.0, 1.5, 2.5),
        rec("kuhn_poker", "first", "equilibrium", 0.0, 0.0, 0.1),
    ]
    trained = [
        rec("connect_four", "both", "mcts100", 0.3, 0.25, 0.35),
        rec("simple_hanabi", "selfplay", "self", 2.5, 2.0, 3.0),
        rec("kuhn_poker", "first", "equilibrium", 0.2, 0.1, 0.3),
    ]
    rows = {(r["game"], r["seat"]): r for r in compare(base, trained)}
    assert set(rows) == {("connect_four", "both"), ("simple_hanabi", "selfplay"), ("kuhn_poker", "first")}
    assert rows["connect_four", "both"]["relative_change"] == pytest.approx((0.3 - 0.15) / 0.15)
    assert rows["simple_hanabi", "selfplay"]["relative_change"] == pytest.approx(0.25)
    assert rows["connect_four", "both"]["trained_lo"] == 0.25
    table = format_table(list(rows.values()))
    assert "+100.0%" in table and "+25.0%" in table and "n/a" in table


def _mcts_games(opponent, seeds, game="tic_tac_toe"):
    """LLM-path games (a scripted random-legal client through the rollout engine) against `opponent`."""
    from palaestra.mars.engine_eval import engine_episodes
    from palaestra.mars.scripted_llm import ScriptedLegalClient
    from palaestra.shared.rollout.engine import RolloutConfig

    rollout = RolloutConfig(max_tokens_per_turn=64, max_turns=50, max_context_tokens=1 << 20, stop=["</answer>"])
    out = []
    for seat in (0, 1):
        results, _ = engine_episodes(
            ScriptedLegalClient(seed=1), rollout, game, seeds, seat, opponent, prompt="compact"
        )
        out += [(r.seed, r.returns, r.winner, r.turns) for r in results]
    return out


@pytest.mark.slow
def test_mcts_replies_on_ray_are_the_local_searches(ray_local):
    """`RayMCTSPlayer` searched ahead on Ray plays exactly the games its in-process reference plays (same seeds per
    game and position), and searched ahead: more searches than replies."""
    from palaestra.mars.games import make_game
    from palaestra.mars.parallel_mcts import RayMCTSPlayer, mcts_reply

    game = make_game("tic_tac_toe")
    seeds = list(range(4))
    local = RayMCTSPlayer(game, 2.0, 20, 2, seed=7, local=True)
    on_ray = RayMCTSPlayer(game, 2.0, 20, 2, seed=7)
    assert _mcts_games(on_ray, seeds) == _mcts_games(local, seeds)
    assert on_ray.searches > local.searches > 0
    # the reference is OpenSpiel's MCTSBot itself, at a position, with its seeded random state
    import numpy as np
    from open_spiel.python.algorithms import mcts

    state = game.new_initial_state()
    state.apply_action(4)
    rng = np.random.RandomState(123)
    bot = mcts.MCTSBot(game.openspiel, 2.0, 20, mcts.RandomRolloutEvaluator(2, rng), solve=False, random_state=rng)
    assert mcts_reply("tic_tac_toe", [4], 2.0, 20, 2, False, 123) == bot.step(state)


def test_first_finished_settings_fail_when_the_config_resolves():
    from palaestra.mars.train import game_env_specs
    from palaestra.shared.config import ConfigError
    from palaestra.shared.jobs import load_config

    base = {"job": "mars.train", "games": [{"game": "kuhn_poker"}, {"game": "tic_tac_toe"}]}
    for batch, group_size, message in (
        ({"rule": "first_finished", "env_slots": [32]}, 1, "batch.env_slots"),
        ({"rule": "first_finished", "env_slots": [2, 2]}, 4, "group_size must be 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            cfg = load_config({**base, "batch": batch, "rollout": {"group_size": group_size}})
            game_env_specs(cfg)
