"""Prompt text a lab supplies: a YAML file that replaces sections of the full prompt (``prompt: full``) per game.

The project ships its own wording of MARS's prompts (`palaestra.mars.games`, `palaestra.mars.env`); a lab
that reproduces MARS with MARS's exact words writes them into a file and names it in ``prompt_file``::

    kuhn_poker:
      system: You are an AI agent that makes optimal decisions to win in the game of Kuhn Poker.
      rules: |-
        1. Kuhn poker is a two-player card game. ...
      player_information: |-
        1. You are player_$player. You are competing with player_$other.
        ...
      response_instructions: |-
        Always choose only one action ... For example, `<answer>$example</answer>`. ...

Sections: ``system``, ``rules``, ``player_information``, ``response_instructions``; a section left out keeps
the project's text. Placeholders (`string.Template`: ``$name``): ``$player`` and ``$other`` (seat numbers),
``$mark`` and ``$other_mark`` (board games), ``$example`` (the example action). MARS's wording has literal
braces (``{your chosen action}``), which ``$`` placeholders leave alone. The turn framing ("Information of
Turn-k", GAME STATE, LEGAL ACTIONS) and the state rendering stay the project's.
"""

from __future__ import annotations

import functools
import string
from pathlib import Path

import yaml

SECTIONS = ("system", "rules", "player_information", "response_instructions")


@functools.lru_cache(maxsize=8)
def load_prompt_text(path: str) -> dict[str, dict[str, str]]:
    """The file's sections per game; unknown games or sections are errors that name them."""
    from palaestra.mars.games import GAMES

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"prompt_file {path}: expected a mapping of game -> sections")
    for game, sections in data.items():
        if game not in GAMES:
            raise ValueError(f"prompt_file {path}: unknown game {game!r}; known: {', '.join(GAMES.names())}")
        if not isinstance(sections, dict):
            raise ValueError(f"prompt_file {path}: {game}: expected a mapping of section -> text")
        for key, text in sections.items():
            if key not in SECTIONS:
                raise ValueError(f"prompt_file {path}: {game}: unknown section {key!r}; known: {', '.join(SECTIONS)}")
            if not isinstance(text, str):
                raise ValueError(f"prompt_file {path}: {game}.{key}: expected text")
    return data


def fill(template: str, **values: object) -> str:
    """The template with its ``$name`` placeholders filled (others, and braces, left as they are)."""
    return string.Template(template).safe_substitute({k: str(v) for k, v in values.items()})
