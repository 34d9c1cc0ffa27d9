"""Equilibrium opponents for the poker games, computed with OpenSpiel's solvers and cached on disk.

`equilibrium_policy(game)` runs OpenSpiel's C++ CFR (``pyspiel.CFRSolver``) or
CFR+ (``pyspiel.CFRPlusSolver``) for a number of iterations, takes the
average policy, measures its exploitability with ``pyspiel.exploitability``
(0 is a Nash equilibrium; in chips per game), and caches the table as JSON
keyed by solver, iterations and game, so later evaluations reuse it.

A game's solver and iterations are its fact (`Game.solver`): CFR 2000 iterations
for Kuhn (exploitability ~1e-3), CFR+ 1000 for Leduc (~1e-3).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pyspiel

from palaestra.mars.games import GAMES, make_game

SOLVERS = {"cfr": pyspiel.CFRSolver, "cfr_plus": pyspiel.CFRPlusSolver}


@dataclass
class Equilibrium:
    game: str
    solver: str
    iterations: int
    exploitability: float
    table: dict[str, list[tuple[int, float]]]
    """Information-state string -> [(action, probability), ...]."""
    seconds: float = 0.0


def equilibrium_policy(
    game: str, solver: str | None = None, iterations: int | None = None, cache_dir: str | Path = "outputs/mars/cache"
) -> Equilibrium:
    """An approximate Nash equilibrium of a poker game (from the cache when present)."""
    reference = make_game(game).solver
    if reference is None:
        raise ValueError(f"no equilibrium solver for {game!r}; available for: {', '.join(solved_games())}")
    default_solver, default_iterations = reference
    solver = solver or default_solver
    iterations = iterations or default_iterations
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; known: {', '.join(SOLVERS)}")
    path = Path(cache_dir) / f"{game}_{solver}_{iterations}.json"
    if path.is_file():
        data = json.loads(path.read_text())
        table = {k: [(int(a), float(p)) for a, p in v] for k, v in data["table"].items()}
        return Equilibrium(game, solver, iterations, data["exploitability"], table, data.get("seconds", 0.0))
    openspiel = make_game(game).openspiel
    start = time.perf_counter()
    run = SOLVERS[solver](openspiel)
    for _ in range(iterations):
        run.evaluate_and_update_policy()
    policy = run.tabular_average_policy()
    seconds = time.perf_counter() - start
    exploitability = float(pyspiel.exploitability(openspiel, policy))
    table = {k: [(int(a), float(p)) for a, p in v] for k, v in policy.policy_table().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"exploitability": exploitability, "seconds": seconds, "table": table}))
    tmp.replace(path)  # atomic: a killed run never leaves a half-written cache
    return Equilibrium(game, solver, iterations, exploitability, table, seconds)


def solved_games() -> list[str]:
    """The games with a reference solver (`Game.solver`)."""
    return [name for name in GAMES.names() if make_game(name).solver is not None]


def table_exploitability(game: str, table: dict[str, list[tuple[int, float]]]) -> float:
    """Exploitability of a policy table, measured by OpenSpiel (independent of how the table was made)."""
    openspiel = make_game(game).openspiel
    policy = pyspiel.TabularPolicy(table)
    return float(pyspiel.exploitability(openspiel, policy))


@functools.cache
def uniform_exploitability(game: str) -> float:
    """The uniform random policy's exploitability (OpenSpiel's), the scale a read-off policy is judged against
    (Kuhn 0.4583, Leduc 2.3736)."""
    openspiel = make_game(game).openspiel
    return float(pyspiel.exploitability(openspiel, pyspiel.TabularPolicy(_uniform_table(openspiel))))


def _uniform_table(openspiel: pyspiel.Game) -> dict[str, list[tuple[int, float]]]:
    table: dict[str, list[tuple[int, float]]] = {}
    stack = [openspiel.new_initial_state()]
    while stack:
        state = stack.pop()
        if state.is_terminal():
            continue
        if not state.is_chance_node():
            legal = state.legal_actions()
            table[state.information_state_string()] = [(a, 1.0 / len(legal)) for a in legal]
        moves = [o for o, _ in state.chance_outcomes()] if state.is_chance_node() else state.legal_actions()
        stack += [state.child(a) for a in moves]
    return table
