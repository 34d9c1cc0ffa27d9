"""End to end: the tiny model learns the toy task through the trainer (experiments/shared/toy_rl.yaml, in-process)."""

from pathlib import Path

import pytest

from palaestra.shared.config import TrackingConfig
from palaestra.shared.jobs import load_config
from palaestra.shared.rl.trainer import Trainer

TOY = Path(__file__).parents[2] / "experiments" / "shared" / "toy_rl.yaml"


def test_toy_config_resolves():
    import palaestra.shared.rl.train  # noqa: F401  (registers rl.train)

    cfg = load_config(TOY)
    assert cfg.job == "rl.train" and cfg.workers.num_workers == 2 and cfg.eval_tasks > 0


@pytest.mark.slow
def test_reward_rises_on_the_toy_task(tmp_path):
    import palaestra.shared.rl.train  # noqa: F401  (registers rl.train)

    cfg = load_config(
        TOY,
        [
            f"output_dir={tmp_path}",
            "workers.num_workers=0",  # in-process rollouts: the Ray path is tested in test_rollout_workers
            "checkpoint_every=0",
        ],
    )
    cfg.tracking = TrackingConfig(enabled=False)
    out = Trainer(cfg).train()
    before, after = out["eval_before_reward_mean"], out["eval_after_reward_mean"]
    # the gain must exceed both confidence half-widths (non-overlapping 95% intervals)
    assert after - before > out["eval_before_reward_ci95"] + out["eval_after_reward_ci95"], out
