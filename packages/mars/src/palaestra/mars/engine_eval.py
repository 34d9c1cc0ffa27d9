"""LLM policies evaluated through the shared rollout engine, the same path training samples with.

The policy's seat is the only agent of a `VersusEnv` (the opponent plays
inside the env); cooperative games run the plain `GameEnv` with the policy in
every seat. Generation is batched across all episodes by `RolloutEngine`,
token-in/token-out with the limits of `RolloutConfig`. Each episode becomes an
`EpisodeResult`; an episode cut by a limit (context, turns) without a result
counts as a format loss of the policy (MARS scores overlong responses so).
"""

from __future__ import annotations

import functools

from palaestra.mars.env import GameEnv, Shaping
from palaestra.mars.play import EpisodeResult
from palaestra.mars.versus import VersusEnv
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

SEAT_NAMES = ("first", "second")


def _make_env(game: str, shaping: Shaping, prompt: str, opponent, seat: int | None, prompt_file: str = ""):
    env = GameEnv(game, shaping, prompt, prompt_file=prompt_file)
    return env if seat is None else VersusEnv(env, opponent, SEAT_NAMES[seat])


def engine_episodes(
    client,
    rollout: RolloutConfig,
    game: str,
    seeds: list[int],
    seat: int | None,
    opponent=None,
    shaping: Shaping | None = None,
    prompt: str = "full",
    run_seed: int = 0,
    prompt_file: str = "",
) -> tuple[list[EpisodeResult], dict[str, float]]:
    """Play one episode per seed; `seat` None means self-play in every seat (cooperative games)."""
    shaping = shaping or Shaping()
    make = functools.partial(_make_env, game, shaping, prompt, opponent, seat, prompt_file)
    specs = [EpisodeSpec(make, s, f"eval-{game}-{i}") for i, s in enumerate(seeds)]
    engine = RolloutEngine(client, RolloutConfig(**{**vars(rollout), "group_size": 1}))
    result = engine.run(specs, seed=run_seed)
    by_episode: dict[str, list] = {}
    for traj in result.trajectories:
        by_episode.setdefault(traj.group_id, []).append(traj)
    cooperative = seat is None
    out = []
    for spec in specs:
        trajs = by_episode.get(spec.group_id, [])
        final = next((t.info.get("final") for t in trajs if t.info.get("final")), None)
        turns = sum(len(t.turns) for t in trajs)
        if final is None:  # cut by a limit, or the env failed: the policy did not finish the game
            policy = 0 if cooperative else seat
            returns = [0.0, 0.0] if cooperative else [1.0, 1.0]
            if not cooperative:
                returns[policy] = -1.0
            out.append(EpisodeResult(game, spec.seed, returns, [], None if cooperative else 1 - policy, policy, turns))
            continue
        loser = final.get("format_loser")
        out.append(
            EpisodeResult(
                game=game,
                seed=spec.seed,
                returns=[float(r) for r in final["returns"]],
                shaped=[],
                winner=final.get("winner"),
                format_loser=int(loser.split("_")[-1]) if loser else None,
                turns=turns,
            )
        )
    return out, result.stats
