"""How long one ``mars.train`` evaluation takes: the estimate ``palaestra plan`` prints (`EVAL_COSTS`).

An evaluation (`palaestra.mars.eval`) plays ``eval.episodes`` episodes in each setting: every game of
``eval.games`` against each opponent that applies (`game_opponents`) in each seat of ``eval.seats``, and the
cooperative games once in self-play. Per setting, with E episodes of a game of L moves:

- model time: E x (model turns per episode) x (tokens per turn) / (generation throughput). The model moves
  L/2 times against an opponent, L times in self-play; a turn generates `RESPONSE_FRACTION` of
  ``max_tokens_per_turn`` (an assumption: reasoning responses stop well before the limit); generation is
  batched across the setting's episodes, at `GPU_TOKENS_PER_S` per vLLM rollout worker for a 4B model
  (scaled by 4B / parameters: decoding reads every weight once per step), or `CPU_TOKENS_PER_S` in a CPU
  process. Both rates are assumptions, not measured here.
- opponent time: MCTS-N costs `mcts_seconds` per reply (E x L/2 replies); random and equilibrium opponents
  cost nothing. With ``eval.mcts_on_ray`` false the replies run one after another in the evaluation loop,
  after the generation: the setting takes model + opponent time. With it true (`palaestra.mars.parallel_mcts`)
  one search per legal learner move runs ahead on Ray, beside the generation: E x L/2 x (legal moves) searches
  spread over the cluster's CPUs, but no less than one game's replies in sequence; the setting takes the
  larger of that and the model time.

Measured here (each game's ``mcts_seconds``, ``mean_moves``, ``mean_legal_moves``, facts on its class in
`palaestra.mars.games`: OpenSpiel's MCTSBot with MARS's uct_c 2 and
10 random rollouts, ``solve`` False, CPU seconds of one core of an AMD EPYC; means over positions drawn from
random games, 30 tic-tac-toe and 12 Connect Four; game lengths and legal moves: means over 300 random games).
The first move costs the most (tic-tac-toe: 0.039 s at 100, 0.24 s at 1,000 simulations; Connect Four: 0.094 s
and 0.99 s); DESIGN.md's 0.09 s for tic-tac-toe's first move at 100 simulations and the issue's 5.7 s per
Connect Four move at 1,000 were not reproduced by this measurement (the estimate uses it). Other simulation
counts scale linearly from the nearest measured one. The exploitability read-off (a few prompts per information
set) is left out.
"""

from __future__ import annotations

from palaestra.mars.eval import game_opponents
from palaestra.mars.games import GAMES, make_game
from palaestra.shared.plan import EvalCost, model_arch

RESPONSE_FRACTION = 0.5
"""Assumed tokens per model turn, as a fraction of ``max_tokens_per_turn``."""
GPU_TOKENS_PER_S = 5000.0
"""Assumed generated tokens per second of one vLLM worker for a 4B-parameter model, batched across episodes."""
CPU_TOKENS_PER_S = 50.0
"""Assumed generated tokens per second of transformers in one CPU process, batched across episodes."""


def mcts_seconds(game: str, simulations: int) -> float:
    """Seconds per MCTS reply: measured, or scaled linearly from the nearest measured simulation count."""
    measured = make_game(game).mcts_seconds
    if simulations in measured:
        return measured[simulations]
    if not measured:
        timed = [name for name in GAMES.names() if make_game(name).mcts_seconds]
        raise ValueError(f"no MCTS timing for {game!r} (measured: {timed})")
    nearest = min(measured, key=lambda n: abs(n - simulations))
    return measured[nearest] * simulations / nearest


def tokens_per_s(cfg) -> tuple[float, str]:
    """The assumed generation throughput of the evaluation (on the training rollouts), and what it assumes."""
    workers = cfg.workers
    llm = workers.llm or cfg.llm
    if workers.num_workers and llm.backend == "vllm":
        try:
            params = model_arch(llm.model)[0].params()
        except ValueError:
            params = int(4e9)
        rate = workers.num_workers * GPU_TOKENS_PER_S * 4e9 / params
        return rate, f"{workers.num_workers} vLLM worker(s) x {GPU_TOKENS_PER_S:g} tokens/s at 4B parameters"
    return CPU_TOKENS_PER_S, f"one CPU process at {CPU_TOKENS_PER_S:g} tokens/s"


def settings(e) -> list[tuple[str, str, int | None, bool]]:
    """(game, opponent label, MCTS simulations or None, self-play) of each setting of `e` (``cfg.eval``)."""
    out: list[tuple[str, str, int | None, bool]] = []
    for game in e.games:
        if make_game(game).cooperative:
            out.append((game, "self", None, True))
            continue
        for kind, label, sims in game_opponents(e, game):
            n = (sims or e.mcts_simulations) if kind == "mcts" else None
            out += [(game, label, n, False)] * len(e.seats)
    return out


def train_eval_cost(cfg, cpus: int) -> EvalCost:
    """One evaluation of a ``mars.train`` config (module docstring), with a line per setting kind."""
    e = cfg.eval
    rate, how = tokens_per_s(cfg)
    limit = getattr(e, "max_tokens_per_turn", None) or getattr(e, "max_tokens", None) or cfg.rollout.max_tokens_per_turn
    per_turn = RESPONSE_FRACTION * limit
    total = 0.0
    rows: dict[tuple[str, str], tuple[int, float, float, float]] = {}  # (game, opponent) -> seats, model, opp., all
    for game, label, sims, selfplay in settings(e):
        moves = make_game(game).mean_moves
        model = e.episodes * (moves if selfplay else moves / 2) * per_turn / rate
        opponent = 0.0
        if sims:
            reply, replies = mcts_seconds(game, sims), e.episodes * moves / 2
            if e.mcts_on_ray:
                opponent = max(replies * make_game(game).mean_legal_moves * reply / cpus, moves / 2 * reply)
            else:
                opponent = replies * reply
        seconds = max(model, opponent) if sims and e.mcts_on_ray else model + opponent
        total += seconds
        count = rows.get((game, label), (0,))[0]
        rows[game, label] = (count + 1, model, opponent, seconds)  # the same in each seat
    where = f"on Ray ({cpus} CPUs, searched ahead per legal move)" if e.mcts_on_ray else "one at a time"
    lines = [
        f"evaluation: {len(settings(e))} settings x {e.episodes} episodes; model turns of "
        f"{per_turn:g} tokens ({RESPONSE_FRACTION:g} x max_tokens_per_turn) at {rate:.0f} tokens/s ({how}; "
        f"assumed); MCTS replies {where}",
    ]
    for (game, label), (count, model, opponent, seconds) in rows.items():
        lines.append(
            f"  {game:>14} vs {label:<11} x{count} seat(s): model {model:8.1f} s, opponent {opponent:8.1f} s "
            f"-> {seconds:8.1f} s each"
        )
    return EvalCost(total, lines)
