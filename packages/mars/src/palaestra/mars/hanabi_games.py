"""Hanabi (2 players, cooperative, scored in self-play): MARS's mini (2 colors x 2 ranks, hand 3, 3
information and 3 life tokens), simple (3 x 2, hand 5, 8 and 3) and full (3 x 3, hand 5, 8 and 3) decks."""

from __future__ import annotations

from palaestra.mars.games import Game, GameKind

COLOR_NAMES = ("Red (R)", "Yellow (Y)", "Green (G)", "White (W)", "Blue (B)")


class Hanabi(Game):
    """Two-player Hanabi with a subclass's deck and tokens (OpenSpiel's ``hanabi`` parameters)."""

    openspiel_name = "hanabi"
    kind = GameKind.hanabi
    title = "Hanabi"
    cooperative = True

    def action_string(self, state, player, action):
        text = state.action_to_string(player, action)  # e.g. "(Play 0)", "(Reveal player +1 color R)"
        text = text.replace("(", "<").replace(")", ">")
        return text.replace("<Play ", "<Play card ").replace("<Discard ", "<Discard card ")

    def rules(self):
        c, r = self.params["colors"], self.params["ranks"]
        hand, life = self.params["hand_size"], self.params["max_life_tokens"]
        info = self.params["max_information_tokens"]
        per_color = 3 + 2 * (r - 2) + 1 if r > 1 else 3
        return (
            "1. Hanabi is a cooperative card game for 2 players, player_0 and player_1.\n"
            f"2. The deck has {c} colors: {', '.join(COLOR_NAMES[:c])}, with ranks from 1 to {r}; each color has "
            f"{per_color} cards (three of rank 1, two of each middle rank, one of rank {r}).\n"
            f"3. Each player holds {hand} cards. Players see the other player's hand, but not their own.\n"
            f"4. There are {info} information tokens and {life} life tokens shared by both players.\n"
            f"5. The goal is to play cards in ascending rank, from 1 to {r}, onto the stack of their color.\n"
            "6. On a turn a player takes one action:\n"
            "    a. <Play card i>: play the i-th card of your own hand (0-indexed). If it is the next rank of its "
            "color stack, it is added and the team scores 1 point; otherwise a life token is lost.\n"
            "    b. <Discard card i>: discard the i-th card of your own hand and regain one information token.\n"
            "    c. <Reveal player +1 color c>: spend an information token to reveal all cards of color c in the "
            "other player's hand.\n"
            "    d. <Reveal player +1 rank r>: spend an information token to reveal all cards of rank r in the "
            "other player's hand.\n"
            "7. After playing or discarding, the player draws a new card (if the deck is not empty).\n"
            f"8. The game ends when all stacks are complete (the maximum score, {c * r}), when the deck runs out "
            "(score: the sum of the stack tops), or when all life tokens are lost (score 0: the points earned so "
            "far are lost)."
        )

    def player_information(self, player):
        return (
            f"You are player_{player}; your teammate is player_{1 - player}.\n"
            "In each of your turns the game state shows the life and information tokens, the fireworks (top card "
            "of each color stack, rank 0 meaning empty), your teammate's hand, what is known about your own cards, "
            "the deck size and the discard pile. 'R2' is a red card of rank 2; 'XX' is a card you cannot see."
        )

    def full_player_information(self, player):
        return (
            f"1. You are player_{player}; your teammate is player_{1 - player}.\n"
            "2. In each of your turns the game state gives the life and information tokens left, the color "
            "stacks, the deck size, the discard pile, your teammate's hand and what has been revealed about your "
            "own cards.\n"
            "3. A known card is written color then rank: 'R2' is a red card of rank 2; 'XX' is a card you cannot "
            "see.\n"
            "4. A color stack is shown by its top card, rank 0 meaning empty: 'Y0' is an empty yellow stack."
        )

    def example_action(self, player):
        return "<Discard card 0>"

    def render_state(self, state, player):
        return state.observation_string(player)

    def format_loss(self, state, player, penalty):
        return -float(state.returns()[player]) - penalty

    def pays_draw_bonus(self, final_return, last_step_reward):
        return last_step_reward == 0


def _params(colors: int, ranks: int, hand: int, info: int, life: int) -> dict[str, int]:
    return {
        "players": 2,
        "colors": colors,
        "ranks": ranks,
        "hand_size": hand,
        "max_information_tokens": info,
        "max_life_tokens": life,
    }


class MiniHanabi(Hanabi):
    name = "mini_hanabi"
    params = _params(2, 2, 3, 3, 3)
    mean_moves = 5.5


class SimpleHanabi(Hanabi):
    name = "simple_hanabi"
    params = _params(3, 2, 5, 8, 3)
    mean_moves = 5.4


class FullHanabi(Hanabi):
    name = "full_hanabi"
    params = _params(3, 3, 5, 8, 3)
    mean_moves = 12.4
