"""Evaluation figures: a poker policy read off the model, and the start-versus-end comparison of a run.

- `policy_figure`: for each information state, the model's probability of each legal action
  (one bar group per state), titled with the exact exploitability; logged once per evaluation step.
- `before_after_figure`: the first and last evaluation of a training run side by side: win rates
  (with their 95% intervals) and exploitabilities.
- `plot_results`: one evaluation's win rates (self-play scores for cooperative games) per setting, as a PNG.
"""

from __future__ import annotations

from pathlib import Path

from palaestra.shared.tracking import new_figure


def policy_figure(game: str, table: dict[str, list[float]], action_names: list[str], exploitability: float):
    """Stacked bars of the action probabilities at every information state."""
    keys = sorted(table, key=lambda k: (len(k), k))
    figure, ax = new_figure(figsize=(max(6.0, 0.55 * len(keys)), 3.5))
    bottom = [0.0] * len(keys)
    for a, name in enumerate(action_names):
        heights = [table[k][a] if a < len(table[k]) else 0.0 for k in keys]
        ax.bar(range(len(keys)), heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(keys)), keys, rotation=45, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("probability")
    ax.set_xlabel("information state (OpenSpiel)")
    ax.set_title(f"{game}: the model's policy, exploitability {exploitability:.4f}")
    ax.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    return figure


def before_after_figure(start: dict[str, float], end: dict[str, float], start_step: int, end_step: int):
    """Bars of the comparable metrics (win rates with intervals, exploitabilities) at two evaluations."""
    keys = [k for k in end if k in start and k.endswith(("/win_rate", "/exploitability"))]
    if not keys:
        return None
    figure, ax = new_figure(figsize=(max(6.0, 1.3 * len(keys)), 4.0))
    width = 0.38
    for offset, (label, metrics) in zip(
        (-width / 2, width / 2), ((f"step {start_step}", start), (f"step {end_step}", end))
    ):
        values = [metrics[k] for k in keys]
        errors = [
            [max(0.0, metrics[k] - metrics.get(f"{k}_lo", metrics[k])) for k in keys],
            [max(0.0, metrics.get(f"{k}_hi", metrics[k]) - metrics[k]) for k in keys],
        ]
        ax.bar([i + offset for i in range(len(keys))], values, width, yerr=errors, capsize=3, label=label)
    ax.set_xticks(range(len(keys)), [k.removeprefix("eval/").replace("/", "\n") for k in keys], fontsize=7)
    ax.set_ylabel("win rate / exploitability")
    ax.set_title("before and after training (95% intervals on rates)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def plot_results(records: list[dict], path: Path) -> Path | None:
    """Win rates with 95% intervals per setting (mean returns for cooperative games)."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['game']}\n{r['seat']} vs {r['opponent']}" for r in records]
    coop = [r["opponent"] == "self" for r in records]
    values = [r["mean_return"] if c else r["win_rate"] for r, c in zip(records, coop)]
    # max(0, .): rounding can put a bound a hair inside the value; matplotlib refuses negative error bars
    lows = [max(0.0, v - (r["mean_return_lo"] if c else r["win_rate_lo"])) for v, r, c in zip(values, records, coop)]
    highs = [max(0.0, (r["mean_return_hi"] if c else r["win_rate_hi"]) - v) for v, r, c in zip(values, records, coop)]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(records)), 4))
    colors = ["tab:green" if c else "tab:blue" for c in coop]
    ax.bar(range(len(records)), values, yerr=[lows, highs], color=colors, capsize=4)
    ax.set_xticks(range(len(records)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("win rate (blue) / self-play score (green)")
    ax.set_title("MARS evaluation (95% intervals)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
