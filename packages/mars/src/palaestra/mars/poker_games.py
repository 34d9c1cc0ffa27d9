"""Poker games (Kuhn, Leduc): private cards, the other seat's moves shown as actions, an equilibrium as the
reference opponent (`palaestra.mars.solvers`)."""

from __future__ import annotations

import pyspiel

from palaestra.mars.games import Game, GameKind


def _moves(state: pyspiel.State) -> list[tuple[int, int]]:
    """(player, action) of every non-chance move so far."""
    return [(pa.player, pa.action) for pa in state.full_history() if pa.player >= 0]


class PokerGame(Game):
    """A two-player poker game: the seats' full information (what the state shows, what a move chooses, the
    actions), a format loss of the offender's bet + penalty, no draw bonus (a split pot included)."""

    kind = GameKind.poker

    ACTIONS: tuple[str, ...] = ()
    state_text = ""
    """What the game state shows (PLAYER INFORMATION, full prompt)."""
    choice_text = ""
    """What a move is chosen from."""

    def full_player_information(self, player):
        actions = " and ".join([", ".join(self.ACTIONS[:-1]), self.ACTIONS[-1]])
        return (
            f"1. You are player_{player}; the other player is player_{1 - player}.\n"
            "2. In each of your turns:\n"
            f"   a. The game state shows {self.state_text}.\n"
            f"   b. Choose an action from {self.choice_text} and the game state.\n"
            f"   c. The legal actions are written {actions}."
        )

    def contribution(self, state, player) -> int:
        raise NotImplementedError

    def format_loss(self, state, player, penalty):
        return -float(self.contribution(state, player)) - penalty

    def pays_draw_bonus(self, final_return, last_step_reward):
        return False


class KuhnPoker(PokerGame):
    name = openspiel_name = "kuhn_poker"
    title = "Kuhn Poker"
    solver = ("cfr", 2000)  # exploitability about 1e-3
    mean_moves = 2.2
    CARDS = ("J", "Q", "K")
    ACTIONS = ("<PASS>", "<BET>")
    state_text = "your private card and the betting so far"
    choice_text = "your card"

    def action_string(self, state, player, action):
        return self.ACTIONS[action]

    def rules(self):
        return (
            "1. Kuhn poker is a two-player card game. The deck has three cards: Jack (J), Queen (Q) and King (K), "
            "ranked K > Q > J.\n"
            "2. Each player antes 1 chip into the pot and is dealt one private card; the third card is unseen.\n"
            "3. Players act in turn, player_0 first. A player can choose to:\n"
            "    a. <PASS>: check if no bet is pending, otherwise fold (the other player wins the pot).\n"
            "    b. <BET>: put 1 more chip into the pot, or call a pending bet.\n"
            "4. If both players pass, or one bets and the other calls, the higher card wins the pot (showdown).\n"
            "5. Your payoff is the chips you win minus the chips you put in."
        )

    def player_information(self, player):
        return (
            f"You are player_{player}. You are competing with player_{1 - player}.\n"
            "In each of your turns the game state shows your private card and the betting so far."
        )

    def example_action(self, player):
        return "<PASS>"

    def contribution(self, state, player) -> int:
        return 1 + sum(1 for p, a in _moves(state) if p == player and a == 1)

    def render_state(self, state, player):
        card = self.CARDS[state.history()[player]]
        lines = [f"Your card: {card}.", "Betting so far:"]
        moves = _moves(state)
        lines += [f"    player_{p}: {self.ACTIONS[a]}" for p, a in moves] or ["    (none)"]
        pot = self.contribution(state, 0) + self.contribution(state, 1)
        lines.append(f"Pot: {pot} chips; you have put in {self.contribution(state, player)}.")
        return "\n".join(lines)


class LeducPoker(PokerGame):
    name = openspiel_name = "leduc_poker"
    title = "Leduc Poker"
    solver = ("cfr_plus", 1000)  # exploitability about 1e-3; 300 iterations take about 5 s here
    mean_moves = 4.1
    RANKS = ("J", "Q", "K")
    ACTIONS = ("<FOLD>", "<CALL>", "<RAISE>")
    state_text = "your private card, the public card once it is revealed, and the betting so far"
    choice_text = "your cards"

    def action_string(self, state, player, action):
        return self.ACTIONS[action]

    def rules(self):
        return (
            "1. Leduc poker is a two-player card game. The deck includes only six cards: two each of King (K), "
            "Queen (Q), and Jack (J).\n"
            "2. At the start of each game, both player_0 and player_1 place 1 chip into the pot as a blind ante.\n"
            "3. Each player is dealt one private card, and the remaining cards are set aside unseen.\n"
            "4. The game has two betting rounds. When the first round ends, one public card from the remaining "
            "cards of the deck is revealed to both players.\n"
            "5. The two players take turns acting in the betting rounds, both starting with player_0. A player can "
            "choose to:\n"
            "    a. <FOLD>: stop betting and the other player wins the pot.\n"
            "    b. <CALL>: match the current bet. If no bet has been made, this is equivalent to checking.\n"
            "    c. <RAISE>: add n chips to the current bet, where n=2 in the first round and n=4 in the second.\n"
            "6. A maximum of two <RAISE>s are allowed in each round. The round ends when both players have acted "
            "and their bets are equal.\n"
            "7. If neither player folds, the second round ends with a showdown: a player whose private card pairs "
            "the public card wins; otherwise the higher card (K > Q > J) wins; equal cards split the pot."
        )

    def player_information(self, player):
        return (
            f"You are player_{player}. You are competing with player_{1 - player}.\n"
            "In each of your turns the game state shows your private card, the public card (if revealed), and "
            "the betting history."
        )

    def example_action(self, player):
        return "<CALL>"

    def contribution(self, state, player) -> int:
        return int(round(100 - state.money()[player]))

    def render_state(self, state, player):
        deals = [pa.action for pa in state.full_history() if pa.player < 0]
        lines = [f"Your card: {self.RANKS[deals[player] // 2]}."]
        if len(deals) > 2:
            lines.append(f"Public card: {self.RANKS[deals[2] // 2]}.")
        else:
            lines.append("Public card: not revealed yet.")
        rounds: list[list[str]] = [[]]
        for pa in state.full_history()[2:]:
            if pa.player < 0:
                rounds.append([])
            else:
                rounds[-1].append(f"player_{pa.player} {self.ACTIONS[pa.action]}")
        for i, moves in enumerate(rounds, start=1):
            lines.append(f"Round {i} betting: {', '.join(moves) if moves else '(none)'}.")
        pot = self.contribution(state, 0) + self.contribution(state, 1)
        lines.append(f"Pot: {pot} chips; you have put in {self.contribution(state, player)}.")
        return "\n".join(lines)
