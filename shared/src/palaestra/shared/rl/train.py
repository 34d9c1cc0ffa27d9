"""The ``rl.train`` job: the RL trainer (`palaestra.shared.rl.trainer`) on any registered envs, and its end-of-run
headline."""

from __future__ import annotations

from palaestra.shared.jobs import format_headline, job
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.tracking import Tracker


@job("rl.train", TrainConfig)
def rl_train(cfg: TrainConfig, tracker: Tracker) -> dict:
    """RL fine-tuning (GRPO / EGPO / MARS advantages, PPO loss) on registered text environments."""
    import palaestra.shared.rollout.tasks  # noqa: F401  (registers the built-in `task` env)
    from palaestra.shared.rl.trainer import Trainer

    with Trainer(cfg, tracker) as trainer:
        trainer.prepare()  # resume or SFT warm start, reference model, rollout workers
        summary = trainer.train()
    return {**summary, "headline": train_headline(summary)}


def train_headline(summary: dict) -> str:
    """The end-of-run line of a `Trainer.train` summary: eval reward before -> after with 95% intervals, or else
    the training reward of the first and last steps."""
    if "eval_after_reward_mean" in summary:
        mean, ci = summary["eval_after_reward_mean"], summary["eval_after_reward_ci95"]
        note = f"{summary['eval_after_trajectories']:.0f} trajectories, 95% CI"
        if "eval_before_reward_mean" in summary:
            b_mean, b_ci = summary["eval_before_reward_mean"], summary["eval_before_reward_ci95"]
            note = f"before training {format_headline('', b_mean, (b_mean - b_ci, b_mean + b_ci)).strip()}; {note}"
        return format_headline("eval reward", mean, (mean - ci, mean + ci), note)
    first, last = summary.get("reward_first", float("nan")), summary.get("reward_last", float("nan"))
    return format_headline("train reward", last, note=f"first step {first:.2f}; no eval: set eval_tasks")
