"""What palaestra-mars adds to the shared registries (every entry-point group names this module; loaded also in
Ray workers).

- jobs (`JOBS`): ``mars.train``, ``mars.eval``, ``mars.mas`` (lazily: their modules
  are imported when a job is looked up), and the rehearsal of ``mars.train``;
- `tiny`'s token set ``mars_board_actions`` (`palaestra.mars.tiny_tokens`);

- envs (`ENVS`): ``mars_game`` (self-play: every seat is an agent of the one
  policy) and ``mars_versus`` (the learner's seat against a fixed opponent:
  random, mcts or equilibrium);
- task sources (`TASKS`): ``mars_legal_moves``, the SFT warm-start
  conversations of legal moves generated from OpenSpiel;
- the advantage estimators (`ADVANTAGES`) ``rae``, SPIRAL's role-conditioned baseline
  (`palaestra.mars.rae`), and ``episode_return`` and ``batch_norm`` (`palaestra.mars.returns`);
- the batch rules (`BATCH_RULES`, rl/batch_rules.py) ``first_finished``, MARS's
  batch (`palaestra.mars.batching.FirstFinished`), and ``mars_rows``, the one
  ``mars.train`` uses: the rows of either rule, credited as ``batch.pre_turn_rewards`` says;
  both registries' modules import torch, which listing jobs must not, so these go through `register_in`;
- the evaluation-time estimate of ``mars.train`` for ``palaestra plan``
  (`EVAL_COSTS`, `palaestra.mars.eval_cost`), and the plan of ``mars.mas``'s table
  (`JOB_PLANS`, `palaestra.mars.mas_plan`).

Their kwargs are plain values, so env specs pickle to rollout workers.
"""

from __future__ import annotations

from typing import Any

from palaestra.mars.env import GameEnv, Shaping
from palaestra.shared.plan import EVAL_COSTS, JOB_PLANS
from palaestra.shared.registry import register_in
from palaestra.shared.rollout.env import ENVS
from palaestra.shared.rollout.tasks import TASKS

register_in("palaestra.batch_rules", "first_finished", "palaestra.mars.batching:FirstFinished")
register_in(
    "palaestra.batch_rules", "mars_rows", "palaestra.mars.batching:MarsRows"
)  # mars.train's: rows, then crediting
EVAL_COSTS.register("mars.train", "palaestra.mars.eval_cost:train_eval_cost")
JOB_PLANS.register("mars.mas", "palaestra.mars.mas_plan:mas_job_plan")  # the MAS table's requests and tokens
register_in("palaestra.advantages", "rae", "palaestra.mars.rae:rae")  # SPIRAL's role-conditioned advantages
register_in(
    "palaestra.advantages", "episode_return", "palaestra.mars.returns:episode_return"
)  # the estimator ablation's
register_in("palaestra.advantages", "batch_norm", "palaestra.mars.returns:batch_norm")


def _shaping(shaping: dict[str, Any] | None) -> Shaping:
    return Shaping(**(shaping or {}))


@ENVS.register("mars_game")  # type: ignore[arg-type]  # a factory; shared ENVS is annotated for classes
def mars_game(
    game: str = "tic_tac_toe",
    shaping: dict[str, Any] | None = None,
    prompt: str = "full",
    opening_moves: int = 0,
    prompt_file: str = "",
) -> GameEnv:
    """A MARS game for self-play (``opening_moves``, ``prompt_file``: see `GameEnv`)."""
    return GameEnv(game, _shaping(shaping), prompt, opening_moves, prompt_file)


@ENVS.register("mars_versus")  # type: ignore[arg-type]  # a factory, as above
def mars_versus(
    game: str = "tic_tac_toe",
    opponent: str = "random",
    seat: str = "alternate",
    shaping: dict[str, Any] | None = None,
    mcts_simulations: int = 100,
    mcts_uct_c: float = 2.0,
    mcts_rollouts: int = 10,
    mcts_solve: bool = False,
    equilibrium_cache: str = "outputs/mars/cache",
    seed: int = 0,
    prompt: str = "full",
    prompt_file: str = "",
):
    """A MARS game with the learner in one seat and a fixed opponent in the other."""
    from palaestra.mars.players import MCTSPlayer, Player, RandomPlayer, TabularPolicyPlayer
    from palaestra.mars.versus import VersusEnv

    env = GameEnv(game, _shaping(shaping), prompt, prompt_file=prompt_file)
    player: Player
    if opponent == "random":
        player = RandomPlayer(seed)
    elif opponent == "mcts":
        player = MCTSPlayer(env.game, mcts_uct_c, mcts_simulations, mcts_rollouts, seed, mcts_solve)
    elif opponent == "equilibrium":
        from palaestra.mars.solvers import equilibrium_policy

        player = TabularPolicyPlayer(equilibrium_policy(game, cache_dir=equilibrium_cache).table, seed=seed)
    else:
        raise ValueError(f"unknown opponent {opponent!r}; known: random, mcts, equilibrium")
    return VersusEnv(env, player, seat)


@TASKS.register("mars_legal_moves")
def mars_legal_moves(
    games: list[str] | None = None, episodes: int = 64, seed: int = 0, prompt: str = "full", **options
) -> list[dict]:
    """SFT conversations of legal moves for each game; ``options``: mover, opponent, random_fraction, first_k
    (see `sft_data.legal_move_conversations`)."""
    from palaestra.mars.sft_data import legal_move_conversations

    rows: list[dict] = []
    for i, game in enumerate(games or ["tic_tac_toe"]):
        rows += legal_move_conversations(game, episodes, seed=seed * 31 + i, prompt=prompt, **options)
    return rows


# The jobs register themselves when first looked up (their modules import the trainer: seconds, which every
# lookup in a registry of these groups would otherwise pay); `tiny`'s action tokens and the rehearsal.
from palaestra.mars import tiny_tokens  # noqa: E402,F401  (registers the `mars_board_actions` token set)
from palaestra.shared.jobs import JOBS  # noqa: E402
from palaestra.shared.rehearse import REHEARSALS  # noqa: E402

JOBS.register("mars.train", "palaestra.mars.train:train_job")
JOBS.register("mars.eval", "palaestra.mars.eval:eval_job")
JOBS.register("mars.mas", "palaestra.mars.mas:mas_job")
REHEARSALS.register("mars.train", "palaestra.mars.rehearsal:TRAIN")  # `palaestra rehearse`
