"""The parent run's view of an ``aed.attack`` run: metrics per scenario and type, against the baselines, figures.

`aggregate` turns the per-task results (one per accident type, plus the random
and passive baselines, all evaluated on the same episode seeds) into metrics:

- per type: the target-type success rate (accidents of the adversary's own
  type per episode, the headline metric) and the any-type attack success rate,
  each with its 95% Wilson interval (``_lo``, ``_hi``), beside the random and
  passive adversaries' rates *of that same type*; the target-type and
  AV-responsible rates minus the passive ones, with Newcombe intervals
  (`palaestra.aed.contrast`); ``beats_random`` compares
  target-type rates (point estimates), ``beats_random_ci`` asks the intervals
  not to overlap;
- per scenario: diversity over what was found (distinct types, entropy over
  types, `evaluation.trajectory_diversity` over all accidents), steps to
  first success, and ``beats_random`` (every type's); with arms (``rewards:
  both``, ``taxonomy: both``) the same diversity per arm
  (``aed/<scenario>/<arm>/distinct_types``, ...): the paper's "more and more
  varied accidents" compares the expert and llm arms on the fixed types.
  LLM-proposed types (arm ``proposed``) are measured against their own
  baselines (random and passive adversaries classified by the proposed
  recognizers, ``aed/<scenario>/random_proposed/...``).

`figures` draws what the paper would show: rates per type with intervals
against the baselines, the learning curves, and the reward-design history.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from palaestra.aed.contrast import passive_contrasts
from palaestra.aed.evaluation import trajectory_diversity, type_entropy, type_rate


def aggregate(by_scenario: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Metrics of the parent run (module docstring) from each scenario's task results."""
    metrics: dict[str, float] = {}
    for scenario, items in by_scenario.items():
        attacks = [r for r in items if r["kind"] == "attack"]
        groups = {
            g: {r["kind"]: r for r in items if r["kind"] in ("random", "passive") and _group(r) == g}
            for g in ("fixed", "proposed")
        }
        types: dict[str, int] = {}
        beats, beats_ci = [], []
        for r in attacks:
            t = r["accident_type"]
            baselines = groups[_group(r)]
            pre = f"aed/{scenario}/{t}" + (f"/{r['arm']}" if r.get("arm") else "")
            for key in ("asr", "target_rate", "responsible_rate", "effective_asr"):
                metrics[f"{pre}/{key}"] = r[key]
                metrics[f"{pre}/{key}_lo"], metrics[f"{pre}/{key}_hi"] = r[f"{key}_ci"]
            for kind, base in baselines.items():
                rate, (lo, hi) = type_rate(base, t)
                metrics.update({f"{pre}/{kind}_target_rate": rate, f"{pre}/{kind}_target_rate_lo": lo})
                metrics[f"{pre}/{kind}_target_rate_hi"] = hi
            if "passive" in baselines:  # each rate minus the victim's own, with the counts behind it
                metrics.update(passive_contrasts(pre, r, baselines["passive"]))
            if "random" in baselines:
                rate, (_, hi) = type_rate(baselines["random"], t)
                beats.append(r["target_rate"] > rate)
                beats_ci.append(r["target_rate_ci"][0] > hi)
                metrics[f"{pre}/beats_random"], metrics[f"{pre}/beats_random_ci"] = float(beats[-1]), beats_ci[-1]
            for name, n in r["types"].items():
                types[name] = types.get(name, 0) + n
            if "preference" in r and "responsible_rate_after" in r["preference"]:
                p = r["preference"]
                for key in ("responsible_rate", "effective_asr", "asr"):
                    for when in ("before", "after"):
                        for end in ("", "_lo", "_hi"):
                            metrics[f"{pre}/{key}_{when}_pref{end}"] = p[f"{key}_{when}{end}"]
        firsts = [r["steps_to_first_success"] for r in attacks if r["steps_to_first_success"] is not None]
        features = [f for r in attacks for f in r.get("accident_features", [])]
        metrics[f"aed/{scenario}/distinct_types"] = len([t for t, n in types.items() if n])
        metrics[f"aed/{scenario}/type_entropy"] = type_entropy(types)
        metrics[f"aed/{scenario}/trajectory_diversity"] = trajectory_diversity(features)
        metrics[f"aed/{scenario}/steps_to_first_success"] = min(firsts) if firsts else -1
        if attacks:
            metrics[f"aed/{scenario}/mean_asr"] = sum(r["asr"] for r in attacks) / len(attacks)
            metrics[f"aed/{scenario}/mean_target_rate"] = sum(r["target_rate"] for r in attacks) / len(attacks)
        for group, baselines in groups.items():
            for kind, base in baselines.items():
                pre = f"aed/{scenario}/{kind}" + ("_proposed" if group == "proposed" else "")
                for key in ("asr", "responsible_rate", "effective_asr"):
                    metrics[f"{pre}/{key}"] = base[key]
                    metrics[f"{pre}/{key}_lo"], metrics[f"{pre}/{key}_hi"] = base[f"{key}_ci"]
        metrics.update(arm_diversity(scenario, attacks))
        if beats:
            metrics[f"aed/{scenario}/beats_random"] = float(all(beats))
            metrics[f"aed/{scenario}/beats_random_ci"] = float(all(beats_ci))
    return metrics


def _group(result: dict[str, Any]) -> str:
    """``proposed`` for the tasks of LLM-proposed types beside the fixed ones (``taxonomy: both``), else ``fixed``."""
    return "proposed" if result.get("arm") == "proposed" else "fixed"


def arm_diversity(scenario: str, attacks: list[dict[str, Any]]) -> dict[str, float]:
    """Distinct accident types, entropy over types and trajectory diversity of each arm's adversaries (pooled)."""
    metrics: dict[str, float] = {}
    for arm in sorted({r["arm"] for r in attacks if r.get("arm")}):
        mine = [r for r in attacks if r.get("arm") == arm]
        types: dict[str, int] = {}
        for r in mine:
            for name, n in r["types"].items():
                types[name] = types.get(name, 0) + n
        features = [f for r in mine for f in r.get("accident_features", [])]
        metrics[f"aed/{scenario}/{arm}/distinct_types"] = len([t for t, n in types.items() if n])
        metrics[f"aed/{scenario}/{arm}/type_entropy"] = type_entropy(types)
        metrics[f"aed/{scenario}/{arm}/trajectory_diversity"] = trajectory_diversity(features)
    return metrics


def headline(by_scenario: dict[str, list[dict[str, Any]]]) -> str:
    """One line for the end-of-run table: the target-type rate pooled over every trained adversary, with its
    interval, beside the random adversary's rate of the same types on the same episodes."""
    from palaestra.shared.jobs import format_headline
    from palaestra.shared.stats import wilson_interval

    hits = episodes = random_hits = random_episodes = 0
    for items in by_scenario.values():
        rand = next((r for r in items if r["kind"] == "random" and _group(r) == "fixed"), None)
        for r in (r for r in items if r["kind"] == "attack" and _group(r) == "fixed"):
            hits, episodes = hits + r["target_count"], episodes + r["episodes"]
            if rand is not None:
                random_hits += rand["types"].get(r["accident_type"], 0)
                random_episodes += rand["episodes"]
    if not episodes:
        return ""
    note = f"{episodes} episodes, 95% Wilson"
    if random_episodes:
        note += f"; random adversary {random_hits / random_episodes:.2f}"
    return format_headline("target-type accident rate", hits / episodes, wilson_interval(hits, episodes), note)


def comparison_table(by_scenario: dict[str, list[dict[str, Any]]], backend: str) -> str:
    """Markdown table of the expert-vs-LLM reward comparison: per type and arm, attack rate, target-type rate
    and AV-responsible share with 95% intervals, beside the random adversary's rate of that type."""

    def cell(value: float, ci) -> str:
        return f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"

    lines = [
        f"Rewards: expert vs LLM-designed (LLM backend: {backend}); same seeds and evaluation episodes per arm.",
        "",
        "| scenario | type | rewards | reward used | attack rate | target-type rate | AV-responsible share |"
        " random: target-type rate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario, items in by_scenario.items():
        rands = {_group(r): r for r in items if r["kind"] == "random"}
        for r in sorted(
            (r for r in items if r["kind"] == "attack"), key=lambda r: (_group(r), r["accident_type"], r["arm"])
        ):
            rand = rands.get(_group(r))
            base = cell(*type_rate(rand, r["accident_type"])) if rand else "-"
            lines.append(
                f"| {scenario} | {r['accident_type']} | {r['arm']} | {r['reward_source']} | "
                f"{cell(r['asr'], r['asr_ci'])} | {cell(r['target_rate'], r['target_rate_ci'])} | "
                f"{cell(r['responsible_rate'], r['responsible_rate_ci'])} | {base} |"
            )
    diversity = ["", "| scenario | arm | distinct types | type entropy | trajectory diversity |", "|" + " --- |" * 5]
    for scenario, items in by_scenario.items():
        per_arm = arm_diversity(scenario, [r for r in items if r["kind"] == "attack"])
        for arm in sorted({k.split("/")[2] for k in per_arm}):
            pre = f"aed/{scenario}/{arm}"
            diversity.append(
                f"| {scenario} | {arm} | {per_arm[pre + '/distinct_types']:.0f} | {per_arm[pre + '/type_entropy']:.2f} "
                f"| {per_arm[pre + '/trajectory_diversity']:.2f} |"
            )
    return "\n".join(lines + diversity) + "\n"


def diversity_figure(scenario: str, items: list[dict[str, Any]]):
    """Per arm: distinct accident types, entropy over types and trajectory diversity of its adversaries."""
    import numpy as np

    from palaestra.shared.tracking import new_figure

    per_arm = arm_diversity(scenario, [r for r in items if r["kind"] == "attack"])
    arms = sorted({k.split("/")[2] for k in per_arm})
    fig, axes = new_figure(1, 3, figsize=(9, 3))
    for ax, key in zip(axes, ("distinct_types", "type_entropy", "trajectory_diversity")):
        ax.bar(np.arange(len(arms)), [per_arm[f"aed/{scenario}/{a}/{key}"] for a in arms], 0.6)
        ax.set_xticks(np.arange(len(arms)), arms, fontsize=8)
        ax.set_title(key.replace("_", " "), fontsize=9)
    fig.suptitle(f"{scenario}: diversity of the accidents found, per arm")
    fig.tight_layout()
    return fig


def comparison_figure(scenario: str, items: list[dict[str, Any]]):
    """Per type, expert vs LLM rewards: attack rate, target-type rate, AV-responsible share, 95% intervals."""
    import numpy as np

    from palaestra.shared.tracking import new_figure

    attacks = [r for r in items if r["kind"] == "attack" and _group(r) == "fixed"]
    types = sorted({r["accident_type"] for r in attacks})
    fig, axes = new_figure(1, 3, figsize=(10, 3.2))
    for ax, (key, label) in zip(
        axes, [("asr", "attack rate"), ("target_rate", "target-type rate"), ("responsible_rate", "AV-responsible")]
    ):
        for k, arm in enumerate(("expert", "llm")):
            rows = [next((r for r in attacks if r["accident_type"] == t and r["arm"] == arm), None) for t in types]
            vals = [(r[key], r[f"{key}_ci"]) if r else (0.0, (0.0, 0.0)) for r in rows]
            means = np.array([v for v, _ in vals])
            err = np.clip(np.array([[v - lo, hi - v] for v, (lo, hi) in vals]).T, 0, None)
            ax.bar(np.arange(len(types)) + (k - 0.5) * 0.4, means, 0.4, yerr=err, capsize=2, label=arm)
        ax.set_xticks(np.arange(len(types)), types, fontsize=7)
        ax.set(ylim=(0, 1), title=label)
    axes[0].set_ylabel("rate (95% Wilson)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{scenario}: expert vs LLM-designed rewards")
    fig.tight_layout()
    return fig


def rates_figure(scenario: str, items: list[dict[str, Any]]):
    """Bar chart per accident type: target-type and any-type rates of the adversary, and the random and passive
    adversaries' rate of that type, with 95% intervals."""
    import numpy as np

    from palaestra.shared.tracking import new_figure

    attacks = [r for r in items if r["kind"] == "attack"]
    groups = {(r["kind"], _group(r)): r for r in items if r["kind"] in ("random", "passive")}
    fig, ax = new_figure(figsize=(1.8 + 1.6 * max(1, len(attacks)), 3.2))
    bars: list[tuple[str, Callable[[dict], tuple[float, Any]]]] = [
        ("target type", lambda r: (r["target_rate"], r["target_rate_ci"]))
    ]
    bars.append(("any type", lambda r: (r["asr"], r["asr_ci"])))

    def baseline_rate(kind: str) -> Callable[[dict], tuple[float, Any]]:
        def get(r: dict) -> tuple[float, Any]:
            base = groups.get((kind, _group(r)))
            return type_rate(base, r["accident_type"]) if base is not None else (0.0, (0.0, 0.0))

        return get

    for kind in sorted({k for k, _ in groups}):  # each type against the baseline classified by its own taxonomy
        bars.append((f"{kind} (target type)", baseline_rate(kind)))
    width = 0.8 / len(bars)
    x = np.arange(len(attacks))
    for i, (label, get) in enumerate(bars):
        vals = [get(r) for r in attacks]
        means = np.array([v for v, _ in vals])
        err = np.clip(np.array([[v - lo, hi - v] for v, (lo, hi) in vals]).T, 0, None)
        ax.bar(x + (i - (len(bars) - 1) / 2) * width, means, width, yerr=err, capsize=2, label=label)
    ax.set_xticks(x, [r["accident_type"] for r in attacks])
    ax.set_ylabel("accidents per episode")
    ax.set_ylim(0, 1)
    ax.set_title(f"{scenario}: attack rates (95% Wilson intervals)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def curves_figure(scenario: str, items: list[dict[str, Any]]):
    """Learning curves per type: any-type and target-type attack rate, and episode reward, against timesteps."""
    from palaestra.shared.tracking import new_figure

    fig, (rates, rewards) = new_figure(1, 2, figsize=(8, 3))
    for r in (r for r in items if r["kind"] == "attack"):
        curve = r.get("train", {}).get("curve", [])
        steps = [p["timesteps"] for p in curve]
        (line,) = rates.plot(steps, [p["target_rate"] for p in curve], label=f"{r['accident_type']} target")
        rates.plot(steps, [p["attack_rate"] for p in curve], "--", color=line.get_color(), label="any type")
        rewards.plot(steps, [p["episode_reward"] for p in curve], color=line.get_color(), label=r["accident_type"])
    rates.set(xlabel="timesteps", ylabel="accidents per training episode", title=f"{scenario}: learning curves")
    rewards.set(xlabel="timesteps", ylabel="mean episode reward")
    rates.legend(fontsize=7)
    rewards.legend(fontsize=7)
    fig.tight_layout()
    return fig


def design_figure(history: list[dict[str, Any]], title: str):
    """Reward-design history: each candidate's fitness by round (failed candidates at -0.05, marked x)."""
    from palaestra.shared.tracking import new_figure

    fig, ax = new_figure(figsize=(4, 3))
    ok = [h for h in history if h["status"] == "ok"]
    bad = [h for h in history if h["status"] != "ok"]
    ax.scatter([h["round"] + 1 for h in ok], [h["fitness"] for h in ok], label="trained candidate")
    ax.scatter([h["round"] + 1 for h in bad], [-0.05] * len(bad), marker="x", color="red", label="refused / failed")
    ax.set(xlabel="round", ylabel="fitness (target rate + 0.1 any-type rate)", title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
