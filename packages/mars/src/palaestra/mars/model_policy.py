"""An LLM's tabular policy on a small imperfect-information game, and its exact exploitability.

`information_state_prompts` walks the whole OpenSpiel game tree and, at every
decision, replays the game through `GameEnv` to get the acting seat's
conversation exactly as the model sees it in play (its own earlier turns as
the well-formed responses ``render_response(action)``). One conversation per
information state; the env shows a seat only what it knows, so every history
of an information state gives the same conversation (tested).

`read_policy` scores, for each information state, the log-probability of each
legal action's response under the model (the response's tokens exactly as the
chat template renders them after the generation prompt, through ``</answer>``;
logits / ``temperature``) and normalizes over the legal actions: the model's
policy restricted to well-formed answers.
`exploitability` is OpenSpiel's exact NashConv / 2 of that `TabularPolicy`
(``open_spiel.python.algorithms.exploitability``): 0 at a Nash equilibrium;
Kuhn poker's uniform policy has 0.4583.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyspiel

from palaestra.mars.env import GameEnv, Shaping, render_response


class _ReplayEnv(GameEnv):
    """A `GameEnv` whose chance outcomes come from a given list instead of its RNG."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chance_queue: list[int] = []

    def _resolve_chance(self) -> None:
        while self.state.is_chance_node():
            self.state.apply_action(self.chance_queue.pop(0))


def _conversation_at(env: _ReplayEnv, history: list[int]) -> tuple[list[dict], pyspiel.State]:
    """Replay `history` (chance and player actions) and return the acting seat's conversation at its end."""
    probe = env.game.new_initial_state()
    i = 0
    while probe.is_chance_node():
        probe.apply_action(history[i])
        i += 1
    env.chance_queue = list(history[:i])
    env.reset(0)  # deals the leading chance outcomes from the queue
    conversations: dict[str, list[dict]] = {a: [] for a in env.agents}
    while i < len(history):
        agent = env.current_agent
        conversations[agent] += env.observe(agent)
        text = env.game.action_string(env.state, env.current_player, history[i])
        conversations[agent].append({"role": "assistant", "content": render_response(text)})
        # chance outcomes that follow this action (e.g. Leduc's public card)
        j = i + 1
        probe = env.state.clone()
        probe.apply_action(history[i])
        while probe.is_chance_node() and j < len(history):
            env.chance_queue.append(history[j])
            probe.apply_action(history[j])
            j += 1
        env.step_action(history[i])
        i = j
    agent = env.current_agent
    return conversations[agent] + env.observe(agent), env.state


def information_state_prompts(game: str, prompt: str = "compact", shaping: Shaping | None = None) -> dict[str, Any]:
    """``{information state string: (player, conversation, legal action ids, legal action strings)}``.

    Raises if two histories of one information state would show the model different conversations."""
    env = _ReplayEnv(game, shaping, prompt)
    out: dict[str, Any] = {}

    def walk(state: pyspiel.State) -> None:
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action))
            return
        player = state.current_player()
        key = state.information_state_string(player)
        conversation, _ = _conversation_at(env, state.history())
        legal = list(state.legal_actions())
        strings = [env.game.action_string(state, player, a) for a in legal]
        if key in out and out[key][1] != conversation:
            raise ValueError(f"{game}: information state {key!r} is shown to the model in two different ways")
        out.setdefault(key, (player, conversation, legal, strings))
        for action in legal:
            walk(state.child(action))

    walk(env.game.new_initial_state())
    return out


def read_policy(
    score: Callable[[list[dict], list[str]], list[float]] | Sequence[Callable[[list[dict], list[str]], list[float]]],
    game: str,
    prompt: str = "compact",
) -> tuple[Any, dict[str, list[float]]]:
    """The model's `TabularPolicy` (legal actions normalized) and ``{info state: probabilities by action id}``.

    ``score(conversation, responses)`` returns the log-probability of each response text; a sequence of them,
    one per player, reads each player's information states off its own model (the joint profile of several
    policies, one per seat)."""
    from open_spiel.python import policy as policy_lib

    tabular = policy_lib.TabularPolicy(GameEnv(game).game.openspiel)
    table: dict[str, list[float]] = {}
    for key, (player, conversation, legal, strings) in information_state_prompts(game, prompt).items():
        scorer = score if callable(score) else score[player]
        logps = np.array(scorer(conversation, [render_response(s) for s in strings]), dtype=np.float64)
        probs = np.exp(logps - logps.max())
        probs /= probs.sum()
        row = tabular.policy_for_key(key)
        row[:] = 0.0
        row[legal] = probs
        table[key] = row.tolist()  # by action id, 0 for illegal actions
    return tabular, table


def exploitability(tabular_policy, game: str) -> float:
    """OpenSpiel's exact exploitability (NashConv / 2) of a `TabularPolicy` of `game`."""
    from open_spiel.python.algorithms import exploitability as expl

    return float(expl.exploitability(GameEnv(game).game.openspiel, tabular_policy))


def response_tokens(client, conversation: list[dict], prompt_ids: list[int], text: str) -> list[int]:
    """The tokens of assistant response `text` as the chat template renders it after the generation prompt (what
    SFT trains on and the model samples: e.g. the project's template writes ``<think></think>\\n<answer>``), up to
    and including the answer's closing ``</answer>`` (where generation stops)."""
    full = client.render([*conversation, {"role": "assistant", "content": text}], add_generation_prompt=False)
    if full[: len(prompt_ids)] != prompt_ids:
        raise ValueError("the chat template does not render the response after the generation prompt")
    ids = full[len(prompt_ids) :]
    for k in range(1, len(ids) + 1):
        if client.tokenizer.decode(ids[:k]).rstrip().endswith("</answer>"):
            return ids[:k]
    raise ValueError(f"the rendered response has no </answer>: {client.tokenizer.decode(ids)!r}")


def response_scorer(client, temperature: float = 1.0) -> Callable[[list[dict], list[str]], list[float]]:
    """``score(conversation, responses)`` over a local transformers client (`client.model`, `client.tokenizer`)."""
    import torch

    model = getattr(client, "model", None)
    if model is None:
        raise ValueError(f"reading a policy needs a local model; the {type(client).__name__} client has none")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to read a policy, not {temperature}")

    def score(conversation: list[dict], responses: list[str]) -> list[float]:
        prompt_ids = client.render(conversation)
        out = []
        with torch.no_grad():
            for text in responses:
                ids = response_tokens(client, conversation, prompt_ids, text)
                full = torch.tensor([prompt_ids + ids], device=model.device)
                logits = model(input_ids=full).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
                logp = torch.log_softmax(logits, dim=-1).gather(-1, full[0, len(prompt_ids) :, None])
                out.append(float(logp.sum()))
        return out

    return score
