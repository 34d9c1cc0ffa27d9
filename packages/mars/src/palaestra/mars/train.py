"""The ``mars.train`` job: MARS self-play RL through the shared trainer, with evaluation before and after.

MARS is a configuration of the shared trainer (`palaestra.shared.rl.trainer`),
not a trainer of its own: this job turns a game mixture into env specs and
runs `Trainer`. Defaults follow MARS:

- self-play (``mode: selfplay``): one shared policy plays every seat; each
  episode yields one trajectory per seat; the games of a batch are drawn from
  the ``games`` mixture by weight, or (``batch.rule: first_finished``) the batch is
  the first rows to finish in fixed environment slots, as MARS's scheduler forms it;
- or against a fixed opponent (``mode: versus``, ``opponent``: random | mcts |
  equilibrium), the learner's seat alternating;
- advantages ``turn_level`` (γ 1) then ``agent_norm`` (per seat and game);
  PPO clip 0.2 with dual clip 1 + 2ε = 1.4 (MARS's ``base_worker.py``), k3 KL 0.2 to the reference;
- an SFT warm start on legal-move conversations generated from OpenSpiel
  (``sft_warmup.source: mars_legal_moves``) when ``sft_warmup.steps`` > 0.

Every piece is a config key, so ablations change one key (``advantages``,
``loss.dual_clip``, ``games``...). ``eval`` runs `mars.eval` on the policy
being trained after the warm start (step 0), every ``eval_every`` steps and at
the end, logged under ``eval/...`` at that step; the summary reports the first
and last win rates vs random with their 95% intervals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from palaestra.mars import plugins  # noqa: F401  (registers the batch rule first_finished and the eval cost)
from palaestra.mars.batching import MarsBatch, check_batch
from palaestra.mars.env import PromptStyle, Shaping, agent_name
from palaestra.mars.eval import GameEvalConfig, Opponent, Policy, Seat, eval_headline, evaluate
from palaestra.mars.eval_table import compare, format_table
from palaestra.mars.games import GAMES
from palaestra.mars.rae import BASELINES
from palaestra.mars.versus import LearnerSeat
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import job
from palaestra.shared.rl.advantages import AdvantageStep
from palaestra.shared.rl.config import EnvSpec, EvalConfig, TrainConfig
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.train import train_headline
from palaestra.shared.tracking import Tracker

if TYPE_CHECKING:
    from palaestra.shared.rl.trainer import Trainer


class Mode(StrEnum):
    selfplay = "selfplay"
    versus = "versus"


class FixedOpponent(StrEnum):
    random = "random"
    mcts = "mcts"
    equilibrium = "equilibrium"


@dataclass
class GameWeight:
    """One game of the training mixture."""

    game: str = "tic_tac_toe"
    weight: float = 1.0


@dataclass
class MarsEval(EvalConfig):
    """Evaluation of the policy during training (a subset of `mars.eval`'s settings), played on the trainer's
    rollout workers with the weights of the last sync. Sampling, response prefix, context and turn limits are
    `EvalConfig`'s: unset, the training rollout's (MARS evaluates with its training sampling: T 0.6, top_p 0.99,
    top_k 100, ``<think>\n``, its 32,768-token sequence)."""

    games: list[str] = field(default_factory=lambda: ["tic_tac_toe"])
    opponents: list[str] = field(default_factory=lambda: ["random"])
    seats: list[str] = field(default_factory=lambda: ["first", "second"])
    episodes: int = 100
    mcts_simulations: int = 100
    mcts_levels: list[int] = field(default_factory=list)
    """MCTS opponents at each simulation count, ``mcts<N>`` in the metrics (MARS: 100 and 1000)."""
    mcts_on_ray: bool = False
    """MCTS replies on Ray workers, searched ahead for each legal move of the model (`parallel_mcts`)."""
    exploitability: list[str] = field(default_factory=list)
    """Poker games whose policy is read off the model and scored exactly: ``eval/<game>/exploitability``."""
    exploitability_temperature: float = 1.0


@dataclass
class MarsTrainConfig(TrainConfig):
    """MARS: self-play RL of one shared policy on OpenSpiel games (every piece switchable)."""

    job: str = "mars.train"
    games: list[GameWeight] = field(
        default_factory=lambda: [GameWeight("tic_tac_toe"), GameWeight("kuhn_poker"), GameWeight("mini_hanabi")]
    )
    """The training mixture (MARS: tic_tac_toe, kuhn_poker, mini_hanabi)."""
    mode: Mode = Mode.selfplay
    """selfplay (one policy in every seat) | versus (the learner against ``opponent``)."""
    opponent: FixedOpponent = FixedOpponent.random
    """Fixed opponent in versus mode: random | mcts | equilibrium (poker)."""
    seat: LearnerSeat = LearnerSeat.alternate
    """The learner's seat in versus mode: first | second | alternate."""
    shaping: Shaping = field(default_factory=Shaping)
    prompt: PromptStyle = PromptStyle.full
    """Prompt style of the games: full (MARS) | compact (short contexts for tiny CPU models)."""
    prompt_file: str = ""
    """A lab's wording of the full prompt's sections, e.g. MARS's exact text (`palaestra.mars.prompt_text`);
    training, the SFT warm start and evaluation read it. Empty: the project's wording."""
    opening_moves: int = 0
    """Self-play only: start each episode after 0..N uniformly random moves (0: from the initial state, as MARS)."""
    envs: list[EnvSpec] = field(default_factory=list)
    """Leave empty: built from ``games``/``mode`` (set it only to train on other registered envs)."""
    advantages: list[AdvantageStep] = field(
        default_factory=lambda: [AdvantageStep("turn_level", {"gamma": 1.0}), AdvantageStep("agent_norm")]
    )
    loss: LossConfig = field(default_factory=lambda: LossConfig(epsilon=0.2, dual_clip=1.4, kl_coef=0.2))
    batch: MarsBatch = field(default_factory=MarsBatch)
    """How a step's batch is formed: a weighted mixture of games (default) or MARS's first rows to finish
    (`palaestra.mars.batching`)."""
    eval: MarsEval = field(default_factory=MarsEval)
    """The trainer's eval hook (every ``eval_every`` steps, before when ``eval_before``, and at the end)."""

    def __post_init__(self) -> None:
        # resolved here, before the config is logged: what MLflow's config.yaml holds is what runs
        super().__post_init__()
        if not self.envs:
            self.envs = game_env_specs(self)
        if self.sft_warmup.steps > 0 and not (self.sft_warmup.source or self.sft_warmup.data_path):
            self.sft_warmup.source = "mars_legal_moves"
            defaults = {"games": [g.game for g in self.games], "prompt": self.prompt}
            if self.prompt_file:
                defaults["prompt_file"] = self.prompt_file
            self.sft_warmup.source_kwargs = {**defaults, **self.sft_warmup.source_kwargs}


def game_env_specs(cfg: MarsTrainConfig) -> list[EnvSpec]:
    if cfg.mode not in list(Mode):
        raise ConfigError(f"mode: unknown mode {cfg.mode!r}; known: {', '.join(Mode)}")
    if not cfg.games:
        raise ConfigError("games: the training mixture is empty")
    shaping = {k: getattr(cfg.shaping, k) for k in Shaping.__dataclass_fields__}
    specs = []
    for g in cfg.games:
        if g.game not in GAMES:
            raise ConfigError(f"games: unknown game {g.game!r}; known games: {', '.join(GAMES.names())}")
        kwargs: dict[str, Any] = {"game": g.game, "shaping": shaping, "prompt": cfg.prompt}
        if cfg.prompt_file:
            kwargs["prompt_file"] = cfg.prompt_file
        if cfg.mode == "selfplay":
            specs.append(EnvSpec("mars_game", {**kwargs, "opening_moves": cfg.opening_moves}, g.weight))
        else:
            specs.append(EnvSpec("mars_versus", {**kwargs, "opponent": cfg.opponent, "seat": cfg.seat}, g.weight))
    check_batch(cfg.batch, specs, cfg.rollout.group_size)  # MARS's batch rule: one slot count per game
    return specs


def _eval_config(cfg: MarsTrainConfig) -> GameEvalConfig:
    e = cfg.eval  # resolved: every sampling field set (TrainConfig.__post_init__)
    temperature, top_p, top_k = e.temperature, e.top_p, e.top_k
    max_tokens, max_context, max_turns = e.max_tokens_per_turn, e.max_context_tokens, e.max_turns
    assert temperature is not None and top_p is not None and top_k is not None
    assert max_tokens is not None and max_context is not None and max_turns is not None
    return GameEvalConfig(
        games=list(e.games),
        policy=Policy.llm,
        llm=cfg.llm,
        temperature=temperature,
        max_tokens=max_tokens,
        stop=list(e.stop or []),
        max_turns=max_turns,
        opponents=[Opponent(o) for o in e.opponents],
        seats=[Seat(s) for s in e.seats],
        episodes=e.episodes,
        mcts_simulations=e.mcts_simulations,
        mcts_levels=list(e.mcts_levels),
        mcts_on_ray=e.mcts_on_ray,
        cluster=cfg.cluster,
        top_p=top_p,
        top_k=top_k,
        response_prefix=e.response_prefix or "",
        max_context_tokens=max_context,
        exploitability=list(e.exploitability),
        exploitability_temperature=e.exploitability_temperature,
        shaping=cfg.shaping,
        prompt=cfg.prompt,
        prompt_file=cfg.prompt_file,
        seed=cfg.seed + 1,
        cache_dir=f"{cfg.output_dir}/cache",
    )


@job("mars.train", MarsTrainConfig)
def train_job(cfg: MarsTrainConfig, tracker: Tracker) -> dict:
    """MARS self-play RL (turn-level advantages, agent normalization) through the shared trainer; eval before/after."""
    from palaestra.shared.rl.policies import policy_of  # torch: only when the job runs, not to show or check it
    from palaestra.shared.rl.trainer import Trainer

    eval_cfg = _eval_config(cfg)
    BASELINES.reset()  # `rae`'s moving averages: each run starts them at 0 (a resumed one: restored below)

    evaluations: list[list[dict]] = []  # each evaluation's records, for MARS's base-vs-trained table

    def game_eval(trainer: Trainer, step: int) -> dict[str, float]:
        # the games are played on the trainer's rollout workers (vLLM where workers.llm says so) with the weights
        # of the last sync; the trainer's own model only scores the exploitability read-off
        clients = {repr(eval_cfg.llm): trainer.client}
        # several policies (one per seat): the exploitability is their joint profile's (rl/policies.py)
        seats = [policy_of(trainer.policies, agent_name(p)).client for p in (0, 1)] if cfg.policies else None
        rollouts = trainer.eval_rollouts()
        metrics, records = evaluate(
            eval_cfg, tracker, step=step, clients=clients, rollouts=rollouts, seat_clients=seats
        )
        evaluations.append(records)
        return metrics

    # the rows of cfg.batch.rule, credited by cfg.batch.pre_turn_rewards (batching.py, rl/batch_rules.py)
    with Trainer(cfg, tracker, eval_hook=game_eval, batch_rule="mars_rows") as trainer:
        BASELINES.attach(trainer.ckpt_dir / "rae_baselines.json", lambda: trainer.step)
        trainer.prepare()  # resume or SFT warm start, reference model, rollout workers
        if trainer.resumed and any(a.name == "rae" for a in cfg.advantages):
            BASELINES.restore(trainer.step)
        elif not trainer.resumed:
            BASELINES.forget()
        out = trainer.train()
    summary: dict[str, Any] = {}
    first = trainer.eval_history[0][1] if cfg.eval_before else {}
    last = trainer.eval_history[-1][1]
    if first and tracker is not None:
        from palaestra.mars.figures import before_after_figure

        figure = before_after_figure(first, last, 0, trainer.step)
        if figure is not None:
            tracker.log_figure(figure, "before_after")
        rows = compare(evaluations[0], evaluations[-1]) if len(evaluations) > 1 else []
        if rows:  # MARS's table: the starting model (step 0) against the trained one
            tracker.log_text(format_table(rows) + "\n", "eval_table.md")
            print(format_table(rows), flush=True)
    summary.update({k: v for k, v in out.items() if isinstance(v, int | float) and not k.startswith("eval_")})
    summary["headline"] = eval_headline(last, first) or train_headline(out)
    for name, metrics in (("start", first), ("end", last)):
        for key, value in metrics.items():
            if key.endswith(
                ("/win_rate", "/win_rate_lo", "/win_rate_hi", "/format_loss_rate", "/mean_return", "/exploitability")
            ):
                summary[f"{name}/{key}"] = value
    return summary
