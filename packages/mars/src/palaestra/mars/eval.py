"""The ``mars.eval`` job: a policy against fixed opponents, in every seat, with confidence intervals.

For each competitive game, the policy under test (an LLM checkpoint by
default) plays first and second seat against each opponent that applies:

- ``random``: uniform over legal actions;
- ``mcts``: OpenSpiel MCTS (``mcts_uct_c`` 2, ``mcts_simulations``, ``mcts_rollouts`` 10 random
  rollouts, ``mcts_solve`` False: MARS's settings), in the board games; with ``mcts_levels`` one opponent
  ``mcts<N>`` per simulation count (MARS: ``mcts100`` and ``mcts1000``);
- ``equilibrium``: CFR for Kuhn, CFR+ for Leduc (OpenSpiel's solvers; cached;
  their exploitability is logged as ``eval/<game>/equilibrium_exploitability``);
- ``checkpoint``: a frozen LLM checkpoint (``opponent_llm``).

Cooperative games (the Hanabi variants) are scored in self-play. Metrics:
``eval/<game>/<first|second|both>/<opponent>/{win_rate,draw_rate,loss_rate,format_loss_rate,truncated_rate,
failed_rate,mean_return}`` (``both``: the two seats' episodes pooled; a game cut by the context or turn limit is
truncated, one whose env raised failed: neither is a win, a loss or a format loss, both count in the episodes)
with ``_lo``/``_hi`` 95% bounds (Wilson for rates, bootstrap for means), and
``eval/<game>/selfplay/self/mean_return`` for Hanabi; plus ``eval_results.json``
and a bar plot artifact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from palaestra.mars.env import PromptStyle, Shaping
from palaestra.mars.game_stats import summarize
from palaestra.mars.games import GAMES, make_game
from palaestra.mars.play import play_episodes
from palaestra.shared.config import ConfigError, JobConfig
from palaestra.shared.jobs import format_headline, job
from palaestra.shared.llm import LLMConfig
from palaestra.shared.tracking import Tracker, scratch_dir


class Seat(StrEnum):
    first = "first"
    second = "second"


class Opponent(StrEnum):
    random = "random"
    mcts = "mcts"
    equilibrium = "equilibrium"
    checkpoint = "checkpoint"


class Policy(StrEnum):
    llm = "llm"
    random = "random"
    mcts = "mcts"


@dataclass
class GameEvalConfig(JobConfig):
    """Evaluate a policy on MARS games against fixed opponents."""

    job: str = "mars.eval"
    games: list[str] = field(default_factory=lambda: ["tic_tac_toe", "kuhn_poker", "mini_hanabi"])
    """Games to evaluate (see `palaestra.mars.games`)."""
    policy: Policy = Policy.llm
    """The player under test: llm (``llm``) | random | mcts (scripted references)."""
    llm: LLMConfig = field(default_factory=LLMConfig)
    """The checkpoint under test (``llm.model``: tiny, a local HF directory, a served model...)."""
    temperature: float = 0.6
    """Sampling temperature of LLM players (MARS: 0.6)."""
    top_p: float = 1.0
    """Nucleus sampling of LLM players (MARS: 0.99, as in training)."""
    top_k: int = 0
    """Top-k sampling of LLM players (0: off; MARS: 100, as in training)."""
    response_prefix: str = ""
    """Text every LLM response starts with, as in training (MARS: ``<think>\n``; `RolloutConfig.response_prefix`)."""
    max_tokens: int = 256
    """Longest response per turn."""
    stop: list[str] = field(default_factory=lambda: ["</answer>"])
    """Stop strings of LLM players (a response ends with its answer; nothing after it can spoil the format)."""
    opponents: list[Opponent] = field(default_factory=lambda: [Opponent.random, Opponent.mcts, Opponent.equilibrium])
    """random | mcts | equilibrium (poker only) | checkpoint (``opponent_llm``)."""
    opponent_llm: LLMConfig = field(default_factory=LLMConfig)
    """The frozen checkpoint opponent (used when ``checkpoint`` is among the opponents)."""
    seats: list[Seat] = field(default_factory=lambda: [Seat.first, Seat.second])
    """Seats of the policy under test: first and/or second."""
    episodes: int = 100
    """Episodes per (game, seat, opponent); MARS uses about 1000."""
    mcts_simulations: int = 100
    """MCTS simulations per move of the ``mcts`` opponent (when ``mcts_levels`` is empty)."""
    mcts_levels: list[int] = field(default_factory=list)
    """MCTS opponents at each of these simulation counts, each its own opponent ``mcts<N>`` in the metrics
    (MARS: 100 and 1000); empty: one ``mcts`` opponent at ``mcts_simulations``."""
    mcts_uct_c: float = 2.0
    mcts_rollouts: int = 10
    """Random rollouts per MCTS leaf evaluation (MARS: 10)."""
    mcts_solve: bool = False
    """MCTS backs up proven wins/losses (MARS: False; True is measurably stronger)."""
    mcts_on_ray: bool = False
    """Run the MCTS replies on Ray workers, one search per legal move of the model ahead of its move, beside the
    other games' and the generation (`palaestra.mars.parallel_mcts`; the same search, seeded per game and
    position). False: one reply at a time in this process."""
    equilibrium_iterations: int = 0
    """CFR/CFR+ iterations (0: the defaults, 2000 CFR for Kuhn, 1000 CFR+ for Leduc)."""
    cache_dir: str = "outputs/mars/cache"
    """Where solved equilibria are cached."""
    shaping: Shaping = field(default_factory=Shaping)
    prompt: PromptStyle = PromptStyle.full
    """Prompt style: full (MARS) | compact (no rules or notes; for tiny CPU models trained on it)."""
    prompt_file: str = ""
    """A lab's wording of the full prompt's sections (`palaestra.mars.prompt_text`; empty: the project's)."""
    max_turns: int = 200
    """A game longer than this stops (truncated)."""
    max_context_tokens: int = 4096
    """Context limit per conversation of an LLM player (the rollout engine's); a game cut by it (or by
    ``max_turns``) is counted as truncated (``truncated_rate``), not as a win, loss or format loss."""
    exploitability: list[str] = field(default_factory=list)
    """Games whose tabular policy is read off the LLM and scored exactly (`palaestra.mars.model_policy`):
    ``eval/<game>/exploitability``; for small games (kuhn_poker: 12 information states)."""
    exploitability_temperature: float = 1.0
    """Temperature of the policy read for ``exploitability`` (1.0: the model's own distribution)."""


def make_player(
    kind: str,
    cfg: GameEvalConfig,
    game,
    llm_config: LLMConfig | None = None,
    clients: dict | None = None,
    simulations: int | None = None,
):
    from palaestra.mars.players import LLMPlayer, MCTSPlayer, RandomPlayer, TabularPolicyPlayer
    from palaestra.mars.solvers import equilibrium_policy

    if kind == "random":
        return RandomPlayer(cfg.seed)
    if kind == "mcts":
        sims = simulations or cfg.mcts_simulations
        if cfg.mcts_on_ray:
            from palaestra.mars.parallel_mcts import RayMCTSPlayer

            args = (game, cfg.mcts_uct_c, sims, cfg.mcts_rollouts, cfg.seed, cfg.mcts_solve)
            return RayMCTSPlayer(*args, cluster=cfg.cluster)
        return MCTSPlayer(game, cfg.mcts_uct_c, sims, cfg.mcts_rollouts, cfg.seed, cfg.mcts_solve)
    if kind == "equilibrium":
        eq = equilibrium_policy(game.name, iterations=cfg.equilibrium_iterations or None, cache_dir=cfg.cache_dir)
        return TabularPolicyPlayer(eq.table, name=eq.solver, seed=cfg.seed)
    if kind in ("llm", "checkpoint"):
        from palaestra.shared.llm import make_client

        llm_config = llm_config or cfg.llm
        key = repr(llm_config)
        if clients is not None and key not in clients:
            clients[key] = make_client(llm_config)
        client = clients[key] if clients is not None else make_client(llm_config)
        return LLMPlayer(
            client,
            cfg.temperature,
            cfg.max_tokens,
            kind,
            cfg.seed,
            list(cfg.stop),
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            response_prefix=cfg.response_prefix,
        )
    raise ConfigError(f"unknown player {kind!r}; known: {', '.join([*Policy, *Opponent])}")


def check_config(cfg: GameEvalConfig) -> None:
    for name in cfg.games:
        if name not in GAMES:
            raise ConfigError(f"games: unknown game {name!r}; known games: {', '.join(GAMES.names())}")
    for name in cfg.opponents:
        if name not in list(Opponent):
            raise ConfigError(f"opponents: unknown opponent {name!r}; known: {', '.join(Opponent)}")
    for seat in cfg.seats:
        if seat not in list(Seat):
            raise ConfigError(f"seats: unknown seat {seat!r}; known: first, second")
    if cfg.policy not in list(Policy):
        raise ConfigError(f"policy: unknown policy {cfg.policy!r}; known: {', '.join(Policy)}")
    if cfg.episodes < 1:
        raise ConfigError("episodes must be at least 1")
    for name in cfg.exploitability:
        if name not in GAMES or make_game(name).solver is None:
            from palaestra.mars.solvers import solved_games

            solved = ", ".join(solved_games())
            raise ConfigError(f"exploitability: {name!r} has no reference solver; games with one: {solved}")
    if cfg.exploitability and cfg.policy != "llm":
        raise ConfigError("exploitability reads the policy off an LLM: it needs policy: llm")


def evaluate(
    cfg: GameEvalConfig,
    tracker: Tracker | None = None,
    step: int | None = None,
    clients: dict | None = None,
    rollouts: Any = None,
    seat_clients: list | None = None,
):
    """Run every setting; return ``{metric name: value}`` (also logged when a tracker is given). `rollouts`: where
    the LLM policy's games play (the trainer's `eval_rollouts`: its workers and synced weights); None: the
    policy's client in this process. `seat_clients`: one client per seat (several policies trained together):
    the exploitability is then the joint profile's, each seat's states read off its own client."""
    check_config(cfg)
    clients = {} if clients is None else clients
    metrics: dict[str, float] = {}
    records: list[dict[str, Any]] = []
    for name in cfg.exploitability:
        _exploitability(cfg, name, clients, metrics, records, tracker, step, seat_clients)
    for name in cfg.games:
        game = make_game(name)
        if game.cooperative and cfg.policy == "mcts":
            print(f"{name}: skipped (OpenSpiel MCTS needs terminal rewards; Hanabi scores every turn)", flush=True)
            continue
        policy = make_player(cfg.policy, cfg, game, clients=clients)
        seeds = [cfg.seed * 100_003 + k for k in range(cfg.episodes)]
        if game.cooperative:
            results = _play(cfg, name, policy, None, None, seeds, rollouts)
            summary = summarize(results, seat=0)
            summary["format_loss_rate"] = sum(r.format_loser is not None for r in results) / len(results)
            _record(metrics, records, name, "selfplay", "self", summary)
            continue
        for opponent_kind, label, sims in game_opponents(cfg, name):
            opponent = make_player(opponent_kind, cfg, game, cfg.opponent_llm, clients, sims)
            if opponent_kind == "equilibrium":
                from palaestra.mars.solvers import equilibrium_policy

                eq = equilibrium_policy(name, iterations=cfg.equilibrium_iterations or None, cache_dir=cfg.cache_dir)
                metrics[f"eval/{name}/equilibrium_exploitability"] = eq.exploitability
            pooled, pooled_seats = [], []
            for seat_name in cfg.seats:
                seat = list(Seat).index(seat_name)
                results = _play(cfg, name, policy, opponent, seat, seeds, rollouts)
                _record(metrics, records, name, seat_name, label, summarize(results, seat))
                pooled += results
                pooled_seats += [seat] * len(results)
            if len(cfg.seats) > 1:  # the win rate against this opponent, whichever seat the policy had
                _record(metrics, records, name, "both", label, summarize(pooled, pooled_seats))
    if tracker is not None:
        tracker.log_metrics(metrics, step=step)
        out = scratch_dir()
        suffix = "" if step is None else f"_step{step:05d}"  # one file per evaluation step, none overwritten
        (out / f"eval_results{suffix}.json").write_text(_json(records))
        tracker.log_artifact(out / f"eval_results{suffix}.json")
        from palaestra.mars.figures import plot_results

        plot = plot_results([r for r in records if "exploitability" not in r], out / f"eval_plot{suffix}.png")
        if plot:
            tracker.log_artifact(plot)
    return metrics, records


def game_opponents(cfg: GameEvalConfig, game: str) -> list[tuple[str, str, int | None]]:
    """(opponent kind, its name in the metrics, MCTS simulations) of each opponent `game` is played against, in
    both seats: equilibria where the game has a reference solver (poker), MCTS in perfect-information games
    only (it would see the hidden cards), ``mcts``
    one ``mcts<N>`` per ``mcts_levels`` entry when that list is set. Cooperative games: none (self-play)."""
    kind_of_game = make_game(game)
    if kind_of_game.cooperative:
        return []
    out: list[tuple[str, str, int | None]] = []
    for kind in cfg.opponents:
        if kind == Opponent.equilibrium and kind_of_game.solver is None:
            continue
        if kind == Opponent.mcts and not kind_of_game.perfect_information:
            continue
        if kind == "mcts" and cfg.mcts_levels:
            out += [("mcts", f"mcts{n}", n) for n in cfg.mcts_levels]
        else:
            out.append((str(kind), str(kind), None))
    return out


def _exploitability(
    cfg: GameEvalConfig, name: str, clients: dict, metrics: dict, records: list, tracker, step, seat_clients=None
) -> None:
    from palaestra.mars.model_policy import exploitability, read_policy, response_scorer

    t = cfg.exploitability_temperature
    if seat_clients:  # the joint profile: each seat's information states off its own policy
        scorer: Any = [response_scorer(c, t) for c in seat_clients]
    else:
        scorer = response_scorer(make_player("llm", cfg, make_game(name), clients=clients).client, t)
    tabular, table = read_policy(scorer, name, cfg.prompt)
    value = exploitability(tabular, name)
    metrics[f"eval/{name}/exploitability"] = value
    if tracker is not None:
        from palaestra.mars.figures import policy_figure

        actions = list(getattr(make_game(name), "ACTIONS", ()))  # poker action strings by action id
        tracker.log_figure(policy_figure(name, table, actions, value), f"{name}_policy", step=step)
    records.append({"game": name, "opponent": "best_response", "exploitability": value, "policy": table})
    from palaestra.mars.solvers import uniform_exploitability

    print(f"{name:>14} exploitability {value:.4f} (uniform: {uniform_exploitability(name):.4f})", flush=True)


def _play(cfg: GameEvalConfig, game: str, policy, opponent, seat: int | None, seeds: list[int], rollouts=None):
    """Episodes of `policy` in `seat` (None: every seat); LLM policies go through the shared rollout engine, on
    `rollouts` when given (the trainer's), else on the policy's client."""
    if getattr(policy, "batched", False):
        from palaestra.mars.engine_eval import engine_episodes
        from palaestra.shared.rollout.engine import RolloutConfig

        rollout = RolloutConfig(
            max_turns=cfg.max_turns,
            max_tokens_per_turn=cfg.max_tokens,
            max_context_tokens=cfg.max_context_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            response_prefix=cfg.response_prefix,
            stop=list(cfg.stop),
        )
        results, _ = engine_episodes(
            policy.client if rollouts is None else rollouts,
            rollout,
            game,
            seeds,
            seat,
            opponent,
            cfg.shaping,
            cfg.prompt,
            run_seed=cfg.seed,
            prompt_file=cfg.prompt_file,
        )
        return results
    players = [policy, policy] if seat is None else ([policy, opponent] if seat == 0 else [opponent, policy])
    return play_episodes(
        game, players, seeds, cfg.shaping, cfg.max_turns, prompt=cfg.prompt, prompt_file=cfg.prompt_file
    )


def _record(metrics, records, game, seat, opponent, summary) -> None:
    prefix = f"eval/{game}/{seat}/{opponent}"
    metrics.update({f"{prefix}/{k}": v for k, v in summary.items()})
    records.append({"game": game, "seat": seat, "opponent": opponent, **summary})
    if opponent == "self":
        print(
            f"{game:>14} self-play score {summary['mean_return']:.2f} "
            f"[{summary['mean_return_lo']:.2f},{summary['mean_return_hi']:.2f}] "
            f"format-loss {summary['format_loss_rate']:.2f}",
            flush=True,
        )
        return
    print(
        f"{game:>14} {seat:>8} vs {opponent:<11} win {summary['win_rate']:.2f} "
        f"[{summary['win_rate_lo']:.2f},{summary['win_rate_hi']:.2f}] draw {summary['draw_rate']:.2f} "
        f"format-loss {summary['format_loss_rate']:.2f} return {summary['mean_return']:+.2f}",
        flush=True,
    )


def _json(obj) -> str:
    import json

    return json.dumps(obj, indent=2)


@job("mars.eval", GameEvalConfig)
def eval_job(cfg: GameEvalConfig, tracker: Tracker) -> dict:
    """Evaluate a policy on MARS games vs random / MCTS / CFR / a checkpoint, both seats; Hanabi in self-play."""
    metrics, records = evaluate(cfg, tracker)
    return {"settings": len(records), "headline": eval_headline(metrics)}


def eval_headline(metrics: dict[str, float], before: dict[str, float] | None = None) -> str | None:
    """The end-of-run line: the win rate vs random with both seats pooled (else the first win rate against an
    opponent) and its 95% Wilson interval; with `before`, the same setting's rate before training too."""
    keys = [k for k in metrics if k.endswith("/win_rate") and k.count("/") == 4 and "/self/" not in k]
    if not keys:
        return None
    key = next((k for k in keys if "/both/random/" in k), keys[0])
    _, game, seat, opponent, _ = key.split("/")
    prefix = key.rsplit("/", 1)[0]
    note = f"95% Wilson, {metrics.get(prefix + '/episodes', 0):.0f} episodes"
    if before and key in before:
        b = before[key]
        note = f"before {b:.2f} [{before[prefix + '/win_rate_lo']:.2f}, {before[prefix + '/win_rate_hi']:.2f}]; {note}"
    interval = (metrics[prefix + "/win_rate_lo"], metrics[prefix + "/win_rate_hi"])
    return format_headline(f"{game} win rate vs {opponent} ({seat} seat)", metrics[key], interval, note)
