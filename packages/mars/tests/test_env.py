"""GameEnv against OpenSpiel itself: same action sequences give the same outcomes and returns."""

from __future__ import annotations

import random
import re

import pyspiel
import pytest

from palaestra.mars.env import GameEnv, Shaping, parse_answer, render_response
from palaestra.mars.games import GAMES, make_game

HANABI = {
    "mini_hanabi": (2, 2, 3, 3, 3),
    "simple_hanabi": (3, 2, 5, 8, 3),
    "full_hanabi": (3, 3, 5, 8, 3),
}


def reference_game(name: str) -> pyspiel.Game:
    """The game loaded straight from pyspiel, with DESIGN.md's Hanabi parameters written out here."""
    if name in HANABI:
        c, r, hand, info, life = HANABI[name]
        params = dict(players=2, colors=c, ranks=r, hand_size=hand, max_information_tokens=info, max_life_tokens=life)
        return pyspiel.load_game("hanabi", params)
    return pyspiel.load_game(name)


def reference_string(name: str, state: pyspiel.State, player: int, action: int) -> str:
    """MARS's action strings derived from OpenSpiel's own action strings (independently of games.py)."""
    raw = state.action_to_string(player, action)
    if name == "tic_tac_toe":  # "x(2,1)"
        return "<" + raw[0].upper() + raw[1:] + ">"
    if name == "connect_four":  # "x3"
        return f"<{raw[0].upper()}({raw[1:]})>"
    if name == "kuhn_poker":  # "Pass" / "Bet"
        return "<" + raw.upper() + ">"
    if name == "leduc_poker":  # "Fold" / "Call" / "Raise"
        return "<" + raw.upper() + ">"
    # hanabi: "(Play 0)" -> "<Play card 0>"
    return raw.replace("(", "<").replace(")", ">").replace("Play ", "Play card ").replace("Discard ", "Discard card ")


def reference_shaping(name: str, shaping: Shaping, seat_return: float, last_step: float) -> float:
    """MARS's end-of-game bonus from DESIGN.md's text: board games on a 0 return, poker never, Hanabi when the
    seat's last step paid 0."""
    if name in ("tic_tac_toe", "connect_four"):
        return shaping.draw_bonus if seat_return == 0 else 0.0
    if name in HANABI:
        return shaping.draw_bonus if last_step == 0 else 0.0
    return 0.0


@pytest.mark.parametrize("shaping", ["none", "default"])
@pytest.mark.parametrize("name", GAMES.names())
def test_random_playouts_match_openspiel(name, shaping):
    """Play random legal action strings through the env; replay the same history in raw pyspiel. Each step's
    rewards are OpenSpiel's change of returns over the move and the chance outcomes after it, for every seat
    (one that has not acted yet included), plus MARS's shaping when it is on: +0.05 to the mover, the end bonus.
    Without shaping each seat's rewards sum to its OpenSpiel return."""
    rules = Shaping(valid_turn_bonus=0.0, draw_bonus=0.0) if shaping == "none" else Shaping()
    env = GameEnv(name, rules)
    rng = random.Random(0)
    for episode in range(40):
        env.reset(seed=episode)
        ref = reference_game(name).new_initial_state()
        totals = dict.fromkeys(env.agents, 0.0)
        while not env.done:
            # catch the reference up on chance outcomes the env sampled
            while ref.is_chance_node():
                ref.apply_action(env.state.history()[len(ref.history())])
            player = ref.current_player()
            assert env.current_agent == f"player_{player}"
            expected = sorted(reference_string(name, ref, player, a) for a in ref.legal_actions())
            assert sorted(env.legal_actions()) == expected
            env.observe(env.current_agent)
            action = rng.choice(ref.legal_actions())
            step = env.step(render_response(reference_string(name, ref, player, action), "random"))
            before = ref.returns()
            ref.apply_action(action)
            while ref.is_chance_node() and len(ref.history()) < len(env.state.history()):
                ref.apply_action(env.state.history()[len(ref.history())])
            paid = [a - b for a, b in zip(ref.returns(), before)]
            want = [paid[p] + (rules.valid_turn_bonus if p == player else 0.0) for p in range(2)]
            if ref.is_terminal():
                want = [w + reference_shaping(name, rules, ref.returns()[p], paid[p]) for p, w in enumerate(want)]
            assert [step.rewards[f"player_{p}"] for p in range(2)] == pytest.approx(want, abs=1e-12)
            for agent, r in step.rewards.items():
                totals[agent] += r
        assert ref.is_terminal()
        assert step.info["returns"] == pytest.approx(ref.returns())
        if shaping == "none":
            assert [totals[a] for a in env.agents] == pytest.approx(ref.returns())
        assert step.info["history"] == ref.history()


def test_reset_seed_fixes_the_deal():
    env = GameEnv("leduc_poker")
    deals = []
    for _ in range(2):
        env.reset(seed=7)
        deals.append(env.state.history())
    env.reset(seed=8)
    assert deals[0] == deals[1]
    assert any(GameEnv("leduc_poker").reset(seed=s) and env.state.history() != deals[0] for s in range(8, 20))


def test_shaping_draw_and_valid_turn_bonus():
    """A drawn tic-tac-toe game: 0 payoff -> +0.1, and +0.05 for each of the agent's turns."""
    env = GameEnv("tic_tac_toe", Shaping(valid_turn_bonus=0.05, draw_bonus=0.1))
    env.reset(0)
    # X O X / X O O / O X X : a draw
    moves = ["<X(0,0)>", "<O(0,1)>", "<X(0,2)>", "<O(1,1)>", "<X(1,0)>", "<O(2,0)>", "<X(2,1)>", "<O(1,2)>", "<X(2,2)>"]
    totals = {"player_0": 0.0, "player_1": 0.0}
    for move in moves:
        step = env.step(render_response(move))
        for a, r in step.rewards.items():
            totals[a] += r
    assert step.terminated and step.info["winner"] == -1
    assert totals["player_0"] == pytest.approx(5 * 0.05 + 0.1)
    assert totals["player_1"] == pytest.approx(4 * 0.05 + 0.1)


@pytest.mark.parametrize(
    "response",
    [
        "<answer><X(0,0)></answer>",
        "<think>x</think><answer><X(3,3)></answer>",
        "garbage",
        "",
        "<think>a</think><answer><O(0,0)></answer>",
        "<think>a</think><answer><X(0,0)></answer> extra",
    ],
)
def test_format_loss_board(response):
    env = GameEnv("tic_tac_toe")
    env.reset(0)
    step = env.step(response)
    assert step.terminated and step.info["format_loss"]
    assert step.rewards == {"player_0": -11.0, "player_1": 0.0}


def test_format_loss_poker_costs_the_bet():
    env = GameEnv("kuhn_poker")
    env.reset(0)
    env.step(render_response("<BET>"))  # player_0 has put in 2 chips
    step = env.step(render_response("<FOLD>"))  # player_1: not a Kuhn action
    assert step.rewards == {"player_0": 0.0, "player_1": -1.0 - 10.0}
    env.reset(1)
    step = env.step("<think></think><answer>BET</answer>")  # no angle brackets: not a legal action string
    assert step.rewards == {"player_0": -1.0 - 10.0, "player_1": 0.0}  # only the ante is in


def test_format_loss_hanabi_costs_the_score():
    env = GameEnv("mini_hanabi")
    env.reset(0)
    score_before = env.state.returns()[0]
    step = env.step("I play my first card")
    assert step.rewards["player_0"] == -score_before - 10.0 and step.rewards["player_1"] == 0.0


def test_unknown_game_lists_known_ones():
    with pytest.raises(ValueError, match="unknown game .tic_tac_tow.; did you mean .tic_tac_toe."):
        make_game("tic_tac_tow")


def test_parse_answer_never_raises():
    assert parse_answer("<think>hm</think>\n<answer> <BET> </answer><|im_end|>") == ("<BET>", None)
    assert parse_answer("<answer><BET></answer>", require_think=False) == ("<BET>", None)
    for junk in ["", "<think>", "<answer></answer>", "\x00" * 10, "<think>a</think><answer>b"]:
        action, error = parse_answer(junk)
        assert action is None or action == ""
        assert error is not None or action == ""


def test_observations_hide_the_opponents_card():
    env = GameEnv("kuhn_poker")
    env.reset(3)
    first = env.observe("player_0")
    assert first[0]["role"] == "system" and "win in the game of Kuhn Poker" in first[0]["content"]
    user = first[1]["content"]
    for section in ("GAME RULES:", "PLAYER INFORMATION:", "RESPONSE INSTRUCTIONS:", "GAME STATE:", "LEGAL ACTIONS:"):
        assert section in user
    mine, theirs = env.state.history()[0], env.state.history()[1]
    cards = "JQK"
    assert f"Your card: {cards[mine]}" in user and f"Your card: {cards[theirs]}" not in user
    env.step(render_response("<BET>"))
    second = env.observe("player_1")
    assert second[0]["role"] == "system"
    env.step(render_response("<PASS>"))
    assert env.done
    env.reset(3)
    env.observe("player_0")
    env.step(render_response("<PASS>"))
    env.observe("player_1")
    env.step(render_response("<BET>"))
    later = env.observe("player_0")
    assert len(later) == 1 and later[0]["role"] == "user"
    assert "This is the other player's turn." in later[0]["content"]
    assert "CHOSEN ACTION:\n<BET>\n" in later[0]["content"]


def test_opening_moves_start_selfplay_from_varied_legal_positions():
    env = GameEnv("tic_tac_toe", opening_moves=3)
    counts, boards = set(), set()
    for seed in range(40):
        env.reset(seed)
        history = env.state.history()
        counts.add(len(history))
        boards.add(tuple(history))
        replay = env.game.openspiel.new_initial_state()
        for action in history:  # OpenSpiel accepts the opening as a sequence of legal moves
            assert action in replay.legal_actions()
            replay.apply_action(action)
        assert env.current_agent == f"player_{replay.current_player()}"
    assert counts == {0, 1, 2, 3} and len(boards) > 10
    env.reset(7)
    first = env.state.history()
    env.reset(7)
    assert env.state.history() == first  # the opening is a function of the reset seed
    plain = GameEnv("tic_tac_toe")
    plain.reset(7)
    assert plain.state.history() == []
    with pytest.raises(ValueError, match="opening_moves"):
        GameEnv("tic_tac_toe", opening_moves=-1)


def _random_game(env: GameEnv, seed: int):
    """Play uniformly random legal actions to the end; return the last step."""
    env.reset(seed)
    rng = random.Random(seed)
    step = None
    while not env.done:
        step = env.step_action(rng.choice(env.state.legal_actions()))
    return step


def test_draw_bonus_never_in_poker_even_on_a_split_pot():
    """MARS's leduc/kuhn envs add no 0.1: a Leduc split pot (return 0 each) earns nothing extra."""
    env = GameEnv("leduc_poker", Shaping(valid_turn_bonus=0.0, draw_bonus=0.1))
    splits = 0
    for seed in range(300):
        step = _random_game(env, seed)
        if list(env.state.returns()) == [0.0, 0.0]:
            splits += 1
            assert step.rewards == {"player_0": 0.0, "player_1": 0.0}
    assert splits > 0  # the case was exercised


def test_hanabi_draw_bonus_when_the_last_step_reward_is_zero():
    """MARS's hanabi env: at the end, 0.1 to each seat whose last-step reward (OpenSpiel's state.rewards()) is 0."""
    env = GameEnv("mini_hanabi", Shaping(valid_turn_bonus=0.0, draw_bonus=0.1))
    paid = differs = 0
    for seed in range(200):
        step = _random_game(env, seed)
        last = env.state.rewards()  # OpenSpiel: the reward of the last transition
        for i, agent in enumerate(env.agents):
            bonus = step.rewards[agent] - last[i]
            assert bonus == pytest.approx(0.1 if last[i] == 0 else 0.0)
            paid += last[i] == 0
            differs += (last[i] == 0) != (env.state.returns()[i] == 0)
    assert paid > 0 and differs > 0  # both rules exercised, and they disagree on some games


def test_full_prompt_uses_marss_turn_framing():
    """MARS's _format_messages: every turn is an "Information of Turn-k" block; an opponent's board-game turn shows
    the board, legal actions and chosen action; a poker turn only the chosen action."""
    env = GameEnv("tic_tac_toe", prompt="full")
    env.reset(0)
    first = env.observe("player_0")[1]["content"]
    assert "RESPONSE INSTRUCTIONS:" in first and "Information of Turn-1:\n\nThis is your turn." in first
    board_before = env.game.render_state(env.state, 1)
    env.step(render_response("<X(1,1)>"))
    text = env.observe("player_1")[1]["content"]
    other = (
        "Information of Turn-1:\n\nThis is the other player's turn. The game state, legal actions, as well as the "
        f"chosen action of the other player for this turn are provided below.\n\nGAME STATE:\n{board_before}\n\n"
        "LEGAL ACTIONS:\n<X(0,0)>, <X(0,1)>, <X(0,2)>, <X(1,0)>, <X(1,1)>, <X(1,2)>, <X(2,0)>, <X(2,1)>, <X(2,2)>."
        "\n\nCHOSEN ACTION:\n<X(1,1)>\nInformation of Turn-2:\n\nThis is your turn."
    )
    assert other in text
    env = GameEnv("kuhn_poker", prompt="full")
    env.reset(0)
    env.observe("player_0")
    env.step(render_response("<BET>"))
    text = env.observe("player_1")[1]["content"]
    assert (
        "Information of Turn-1:\n\nThis is the other player's turn. The game state for this turn is not available "
        "to you. The chosen action of the other player for this turn is provided below.\n\nCHOSEN ACTION:\n<BET>\n"
        "Information of Turn-2:\n\nThis is your turn."
    ) in text
    # compact prompts keep their short form (no turn framing)
    env = GameEnv("kuhn_poker", prompt="compact")
    env.reset(0)
    env.observe("player_0")
    env.step(render_response("<BET>"))
    assert env.observe("player_1")[1]["content"].startswith("PLAYER INFORMATION:")


def _marss_length_penalty(token_length: int) -> float:
    """MARS's compute_length_penalty (env_manager.py), written out: scale upper 0, lower 0.5, 11..2048, coef 1."""
    reward = 1 - (token_length - 11) / (2048 - 11)
    if reward > 0:
        reward *= 0.0
    if reward < 0:
        reward *= 0.5
    return reward


@pytest.mark.parametrize("tokens", [5, 11, 300, 2048, 2049, 3000, 4085, 6000])
def test_length_penalty_matches_marss_rule(tokens):
    env = GameEnv("tic_tac_toe", Shaping(valid_turn_bonus=0.05, length_penalty=0.5, length_min=11, length_max=2048))
    env.reset(0)
    env.note_response(tokens, truncated=False)
    step = env.step(render_response("<X(1,1)>"))
    assert not step.terminated
    assert step.rewards["player_0"] == pytest.approx(0.05 + _marss_length_penalty(tokens))
    assert step.rewards["player_1"] == 0.0
    if tokens == 4085:  # r = 1 - (4085 - 11) / 2037 = -1 exactly
        assert step.rewards["player_0"] == pytest.approx(0.05 - 0.5)
    # the note covers one response only: the next step, told nothing, has no length term
    step = env.step(render_response("<O(0,0)>"))
    assert step.rewards["player_1"] == pytest.approx(0.05)


def test_truncated_response_is_a_format_loss_only_when_asked():
    for rule, loss in ((True, True), (False, False)):
        env = GameEnv("tic_tac_toe", Shaping(truncated_is_format_loss=rule, length_penalty=0.5))
        env.reset(0)
        env.note_response(4096, truncated=True)
        step = env.step(render_response("<X(1,1)>"))  # well formed, but cut by the token limit
        assert step.terminated is loss and step.info.get("format_loss", False) is loss
        expected = (-11.0 if loss else 0.05) + _marss_length_penalty(4096)
        assert step.rewards["player_0"] == pytest.approx(expected)


def test_the_rollout_engine_tells_the_env_the_length_and_the_cut(tiny_llm):
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    shaping = Shaping(truncated_is_format_loss=True, length_penalty=0.5, length_min=0, length_max=1)
    cfg = RolloutConfig(max_tokens_per_turn=2, temperature=1.0)
    specs = [EpisodeSpec(lambda: GameEnv("tic_tac_toe", shaping), seed=i, group_id=str(i)) for i in range(4)]
    trajs = RolloutEngine(tiny_llm, cfg).run(specs, seed=0).trajectories
    first = [t for t in trajs if t.agent == "player_0"]
    for t in first:
        turn = t.turns[0]
        n = len(turn.response_ids)
        if turn.finish_reason == "length":  # cut: a format loss, whatever the text
            assert t.info["final"]["format_error"] == "the response hit the token limit"
        # -11 for the loss (2 tokens cannot hold a well-formed answer) plus 0.5 * (1 - n), MARS's rule on 0..1
        assert turn.reward == pytest.approx(-11.0 + 0.5 * min(0.0, 1 - n))
    assert any(t.turns[0].finish_reason == "length" for t in first)


def _marss_overlong_sequence(sequence_length: int, prompt_tokens: int, token_length: int) -> bool:
    """MARS's get_env_input (env_manager.py), written out: token_left = sequence_length - current_sequence_length -
    token_length, where current_sequence_length is the length of the prompt the model answered; overlong when
    token_left <= 1000."""
    token_left = sequence_length - prompt_tokens - token_length
    return token_left <= 1000


@pytest.mark.parametrize(("prompt_tokens", "tokens"), [(100, 50), (31000, 767), (31000, 768), (31767, 1), (0, 31768)])
def test_overlong_sequence_is_a_format_loss_as_marss_rule(prompt_tokens, tokens):
    loss = _marss_overlong_sequence(32768, prompt_tokens, tokens)
    assert loss is ((prompt_tokens, tokens) in {(31000, 768), (31767, 1), (0, 31768)})  # the boundary: 1000 left
    env = GameEnv("kuhn_poker", Shaping(sequence_length=32768, sequence_margin=1000))
    env.reset(3)
    env.note_response(tokens, truncated=False, prompt_tokens=prompt_tokens)
    step = env.step(render_response("<BET>"))  # well formed and legal
    assert step.terminated is loss and step.info.get("format_loss", False) is loss
    # the offender loses its ante (1) and the format penalty 10, the other agent gets 0; else the bet goes through
    assert step.rewards["player_0"] == pytest.approx(-11.0 if loss else 0.05)
    assert step.rewards.get("player_1", 0.0) == 0.0
    # off (sequence_length 0, the default): the same response is played
    env = GameEnv("kuhn_poker")
    env.reset(3)
    env.note_response(tokens, truncated=False, prompt_tokens=prompt_tokens)
    assert not env.step(render_response("<BET>")).terminated


def test_overlong_sequence_settings_are_checked():
    with pytest.raises(ValueError, match="sequence_margin"):
        Shaping(sequence_length=1000, sequence_margin=1000)
    with pytest.raises(ValueError, match="must be >= 0"):
        Shaping(sequence_length=-1)


def test_the_rollout_engine_tells_the_env_the_prompt_length(tiny_llm):
    """End to end: the overlong-sequence rule sees the prompt the engine built. The first prompt's length is
    measured by a first rollout; a sequence of that + 100 tokens with margin 99 then loses the first move (at most
    99 left after any non-empty response), + 400 does not (24 tokens at most per response)."""
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    cfg = RolloutConfig(max_tokens_per_turn=24, temperature=1.0, max_turns=1, stop=["</answer>"])

    def first_turn(shaping: Shaping):
        spec = EpisodeSpec(lambda: GameEnv("kuhn_poker", shaping, prompt="compact"), seed=0, group_id="0")
        trajs = RolloutEngine(tiny_llm, cfg).run([spec], seed=0).trajectories
        return next(t for t in trajs if t.agent == "player_0").turns[0]

    n = len(first_turn(Shaping()).prompt_ids)
    why = "at most 99 tokens of the sequence are left"
    for extra, loss in ((100, True), (400, False)):
        turn = first_turn(Shaping(sequence_length=n + extra, sequence_margin=99))
        assert len(turn.prompt_ids) == n and 1 <= len(turn.response_ids) <= 24
        assert _marss_overlong_sequence(n + extra + 901, len(turn.prompt_ids), len(turn.response_ids)) is loss
        assert (turn.error == why) is loss


def test_minimal_prompt_is_the_state_alone_and_shows_each_seat_its_card():
    """`minimal`: one user message per turn (no system prompt, no PLAYER INFORMATION), the acting seat's card in
    it; every Kuhn information state gets its own conversation whose last card line is the state's card."""
    from palaestra.mars.model_policy import information_state_prompts

    env = GameEnv("kuhn_poker", prompt="minimal")
    env.reset(0)
    first = env.observe("player_0")
    assert [m["role"] for m in first] == ["user"] and first[0]["content"].startswith("GAME STATE:\nYour card: ")
    assert "PLAYER INFORMATION" not in first[0]["content"]
    env.step(render_response("<BET>"))
    second = env.observe("player_1")
    assert [m["role"] for m in second] == ["user"]
    assert second[0]["content"].startswith("player_0 took action <BET>.\n\nGAME STATE:\nYour card: ")
    prompts = information_state_prompts("kuhn_poker", "minimal")
    assert len(prompts) == 12
    texts = set()
    for key, (_, conversation, _, strings) in prompts.items():
        assert strings == ["<PASS>", "<BET>"]
        last = conversation[-1]["content"]
        assert re.findall(r"Your card: ([JQK])\.", last) == ["JQK"[int(key[0])]]
        texts.add(repr(conversation))
    assert len(texts) == 12
