"""Fixed-opponent envs and the legal-move SFT data."""

from __future__ import annotations

import random
import re

import pytest

from palaestra.mars.env import GameEnv, Shaping, parse_answer, render_response
from palaestra.mars.players import RandomPlayer
from palaestra.mars.sft_data import legal_move_conversations
from palaestra.mars.versus import VersusEnv


@pytest.mark.parametrize("game", ["tic_tac_toe", "leduc_poker", "connect_four"])
def test_versus_env_credits_the_learner_with_its_seat_return(game):
    shaping = Shaping(valid_turn_bonus=0.0, draw_bonus=0.0)
    env = VersusEnv(GameEnv(game, shaping), RandomPlayer(5), seat="alternate")
    rng = random.Random(0)
    seats = set()
    for seed in range(30):
        info = env.reset(seed)
        seats.add(info["learner_seat"])
        me = env.agents[0]
        assert me == f"player_{info['learner_seat']}"
        total = 0.0
        done = False
        while not done:
            assert env.current_agent == me and env.env.current_agent == me
            env.observe(me)
            step = env.step(render_response(rng.choice(env.env.legal_actions())))
            assert set(step.rewards) == {me}
            total += step.rewards[me]
            done = step.done
        assert total == pytest.approx(env.env.state.returns()[info["learner_seat"]])
    assert seats == {0, 1}


def test_versus_env_format_loss():
    env = VersusEnv(GameEnv("tic_tac_toe"), RandomPlayer(0), seat="second")
    env.reset(0)
    step = env.step("no answer here")
    assert step.terminated and step.rewards == {"player_1": -11.0}


def test_sft_rows_are_legal_games():
    rows = legal_move_conversations("kuhn_poker", episodes=10, seed=1)
    assert len(rows) == 20
    for row in rows:
        msgs = row["messages"]
        assert msgs[0]["role"] == "system" and msgs[1]["role"] == "user"
        for i, m in enumerate(msgs[2:], start=2):
            assert m["role"] == ("assistant" if i % 2 == 0 else "user")
        for m in msgs:
            if m["role"] == "assistant":
                action, error = parse_answer(m["content"])
                assert error is None
                # the move is among the legal actions listed in the observation just before it
                prev = msgs[msgs.index(m) - 1]["content"]
                assert action in prev.split("LEGAL ACTIONS:\n")[-1]
    with pytest.raises(ValueError, match="mover must be one of"):
        legal_move_conversations("kuhn_poker", 1, mover="alphazero")
    with pytest.raises(ValueError, match="opponent must be one of"):
        legal_move_conversations("kuhn_poker", 1, opponent="mcts")


def test_first_mover_against_random_records_one_varied_seat():
    rows = legal_move_conversations("tic_tac_toe", episodes=20, seed=3, mover="first", opponent="random")
    assert len(rows) == 20
    assert {r["agent"] for r in rows} == {"player_0", "player_1"}  # the recorded seat alternates
    boards = set()
    for row in rows:
        msgs = row["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                listed = msgs[i - 1]["content"].split("LEGAL ACTIONS:\n")[-1]  # this turn's (after others' turns)
                first = re.match(r"<[^>]*>", listed).group(0)
                assert parse_answer(m["content"])[0] == first
                boards.add(msgs[i - 1]["content"].rsplit("LEGAL ACTIONS:", 1)[0])
    assert len(boards) > 20  # the random opponent makes the boards differ from game to game


def test_random_fraction_mixes_in_other_legal_moves():
    def firsts(fraction):
        rows = legal_move_conversations("tic_tac_toe", 30, seed=4, mover="first", random_fraction=fraction)
        hits = []
        for row in rows:
            msgs = row["messages"]
            for i, m in enumerate(msgs):
                if m["role"] == "assistant":
                    listed = msgs[i - 1]["content"].split("LEGAL ACTIONS:")[-1]
                    hits.append(parse_answer(m["content"])[0] == re.search(r"<[^>]*>", listed).group(0))
        return sum(hits) / len(hits)

    assert firsts(0.0) == 1.0
    assert 0.3 < firsts(0.5) < 0.9  # about half random (a random pick can also be the first item)
    with pytest.raises(ValueError, match="random_fraction"):
        legal_move_conversations("tic_tac_toe", 1, mover="first", random_fraction=1.5)


def test_first_k_mover_plays_one_of_the_first_k_listed_items():
    rows = legal_move_conversations("tic_tac_toe", 40, seed=2, mover="first", first_k=2, opponent="random")
    positions = []
    for row in rows:
        msgs = row["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                listed = re.findall(r"<[^>]*>", msgs[i - 1]["content"].split("LEGAL ACTIONS:")[-1])
                if len(listed) > 1:
                    positions.append(listed.index(parse_answer(m["content"])[0]))
    assert set(positions) == {0, 1}
    assert 0.35 < positions.count(0) / len(positions) < 0.65  # each of the two about half the time
    with pytest.raises(ValueError, match="first_k"):
        legal_move_conversations("tic_tac_toe", 1, mover="first", first_k=0)


@pytest.mark.parametrize("game", ["tic_tac_toe", "connect_four"])
def test_tiny_tokenizer_has_one_token_per_board_action(game):
    # a legal move of the tiny model is then a copy of one listed token (palaestra.shared.llm.tiny.GAME_TOKENS)
    from palaestra.shared.llm.tiny import build_tokenizer

    tok = build_tokenizer()
    env, rng, seen = GameEnv(game), random.Random(0), set()
    for seed in range(40):
        env.reset(seed)
        while not env.done:
            seen.update(env.legal_actions())
            env.step(render_response(rng.choice(env.legal_actions())))
    assert len(seen) == {"tic_tac_toe": 18, "connect_four": 14}[game]  # every action string of the game was seen
    answer = len(tok.encode("<answer></answer>", add_special_tokens=False))
    for action in seen:
        assert len(tok.encode(f"<answer>{action}</answer>", add_special_tokens=False)) == answer + 1, action


def test_equilibrium_mover_plays_cfr_and_mixes_in_random(tmp_path):
    """With random_fraction 0 a dominated Kuhn move never appears (calling a bet with J), and the dominant one
    always does (player_1 betting K after a pass); with random_fraction 1 J calls about half the time."""

    def choices(fraction):
        rows = legal_move_conversations(
            "kuhn_poker",
            300,
            seed=5,
            mover="equilibrium",
            random_fraction=fraction,
            prompt="compact",
            equilibrium_cache=str(tmp_path),
        )
        out = {"J facing a bet": [], "K after a pass": []}
        for row in rows:
            msgs = row["messages"]
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                prev = msgs[i - 1]["content"]
                card, betting = prev.split("Your card: ")[1][0], prev.split("Betting so far:")[1].split("Pot:")[0]
                if card == "J" and betting.strip().endswith(": <BET>"):
                    out["J facing a bet"].append(parse_answer(m["content"])[0])
                if card == "K" and row["agent"] == "player_1" and betting.strip() == "player_0: <PASS>":
                    out["K after a pass"].append(parse_answer(m["content"])[0])
        return out

    pure = choices(0.0)
    assert pure["J facing a bet"] and set(pure["J facing a bet"]) == {"<PASS>"}
    assert pure["K after a pass"] and set(pure["K after a pass"]) == {"<BET>"}
    noisy = choices(1.0)["J facing a bet"]
    assert 0.3 < noisy.count("<BET>") / len(noisy) < 0.7


def test_card_strength_mover_bets_or_calls_by_its_card():
    """Each recorded decision's card is read back from the conversation the model sees; the bet-or-call frequency
    per card matches strength (J, Q, K) within 4 binomial standard deviations, before and after a bet."""
    strength = [0.1, 0.5, 0.9]
    rows = legal_move_conversations(
        "kuhn_poker", 1500, seed=3, mover="card_strength", prompt="minimal", strength=strength
    )
    counts: dict[tuple[str, bool], list[int]] = {}
    for row in rows:
        msgs = row["messages"]
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            seen = msgs[i - 1]["content"]
            card = re.search(r"Your card: ([JQK])\.", seen).group(1)
            facing_bet = "took action <BET>" in seen
            action, error = parse_answer(m["content"])
            assert error is None and action in ("<PASS>", "<BET>")
            counts.setdefault((card, facing_bet), []).append(action == "<BET>")
    assert len(counts) == 6  # every card meets both situations
    for (card, _), bets in counts.items():
        p = strength["JQK".index(card)]
        assert abs(sum(bets) / len(bets) - p) < 4 * (p * (1 - p) / len(bets)) ** 0.5 + 1e-9


def test_card_strength_mover_is_checked():
    with pytest.raises(ValueError, match="kuhn_poker"):
        legal_move_conversations("leduc_poker", 2, mover="card_strength", strength=[0.1, 0.5, 0.9])
    with pytest.raises(ValueError, match="kuhn_poker"):
        legal_move_conversations("kuhn_poker", 2, mover="card_strength")
    with pytest.raises(ValueError, match="three probabilities"):
        legal_move_conversations("kuhn_poker", 2, mover="card_strength", strength=[0.1, 1.5, 0.9])


def test_scripted_players_draws_are_independent_of_the_deal():
    """A player seeded with the episode's seed (as the SFT data, versus and play do) must not repeat the draws that
    dealt the cards: a 'bet with probability 0.2 whatever the card' player bets about 0.2 of the time with each card
    (with a shared stream it bet 0.6 with J: the deal's draw u < 1/3 was reused as the bet draw)."""
    env = GameEnv("kuhn_poker", prompt="minimal")
    bets = {0: [], 1: [], 2: []}
    for episode in range(3000):
        env.reset(episode)
        rng = random.Random(episode)  # the player's own stream, seeded as the callers do
        bets[env.state.history()[0]].append(rng.random() < 0.2)
    for card, b in bets.items():
        assert abs(sum(b) / len(b) - 0.2) < 4 * (0.16 / len(b)) ** 0.5, card
