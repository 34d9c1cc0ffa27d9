"""LLM policies evaluated through the shared rollout engine, the same path training samples with.

The policy's seat is the only agent of a `VersusEnv` (the opponent plays
inside the env); cooperative games run the plain `GameEnv` with the policy in
every seat. Generation is batched across all episodes by `RolloutEngine`,
token-in/token-out with the limits of `RolloutConfig`, on the rollouts given (the
trainer's: its workers and synced weights) or on a client in this process. Each
episode becomes an `EpisodeResult`; an episode cut by a limit (context, turns)
before the game ended is marked truncated, one whose env raised failed: no
winner, returns 0, counted by `summarize` as ``truncated_rate`` / ``failed_rate``
(a response cut by ``max_tokens_per_turn`` is read by the env, which scores an
unfinished answer as a format loss, as MARS does).
"""

from __future__ import annotations

import dataclasses
import functools

from palaestra.mars.env import GameEnv, Shaping
from palaestra.mars.play import EpisodeResult
from palaestra.mars.versus import LearnerSeat, VersusEnv
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
from palaestra.shared.rollout.workers import LocalRollouts


def _make_env(game: str, shaping: Shaping, prompt: str, opponent, seat: int | None, prompt_file: str = ""):
    env = GameEnv(game, shaping, prompt, prompt_file=prompt_file)
    return env if seat is None else VersusEnv(env, opponent, (LearnerSeat.first, LearnerSeat.second)[seat])


def engine_episodes(
    rollouts,
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
    """Play one episode per seed; `seat` None means self-play in every seat (cooperative games). `rollouts`: a
    `LocalRollouts` / `RayRollouts` (``run(specs, seed, cfg)``), or an `LLMClient` played on in this process."""
    shaping = shaping or Shaping()
    make = functools.partial(_make_env, game, shaping, prompt, opponent, seat, prompt_file)
    specs = [EpisodeSpec(make, s, f"eval-{game}-{i}") for i, s in enumerate(seeds)]
    rollout = dataclasses.replace(rollout, group_size=1)
    if not hasattr(rollouts, "run"):  # a client
        rollouts = LocalRollouts(rollouts, rollout)
    result = rollouts.run(specs, run_seed, rollout)
    by_episode: dict[str, list] = {}
    for traj in result.trajectories:
        by_episode.setdefault(traj.group_id, []).append(traj)
    out = []
    for spec in specs:
        trajs = by_episode.get(spec.group_id, [])
        final = next((t.info.get("final") for t in trajs if t.info.get("final")), None)
        turns = sum(len(t.turns) for t in trajs)
        if final is None:  # cut by a limit, or the env failed: the game has no result
            failed = any(t.failed for t in trajs) or not trajs
            out.append(
                EpisodeResult(game, spec.seed, [0.0, 0.0], [], None, None, turns, truncated=not failed, failed=failed)
            )
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
