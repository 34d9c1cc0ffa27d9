"""The generic jobs of the RL core: ``rl.train`` (the trainer on any registered envs) and ``rl.sft``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from palaestra.shared.config import JobConfig
from palaestra.shared.jobs import job
from palaestra.shared.llm.base import LLMConfig
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.sft import SFTOptions
from palaestra.shared.tracking import Tracker


@job("rl.train", TrainConfig)
def rl_train(cfg: TrainConfig, tracker: Tracker) -> dict:
    """RL fine-tuning (GRPO / EGPO / MARS advantages, PPO loss) on registered text environments."""
    import palaestra.shared.rollout.tasks  # noqa: F401  (registers the built-in `task` env)
    from palaestra.shared.rl.trainer import Trainer

    return Trainer(cfg, tracker).train()


@dataclass
class SFTJobConfig(JobConfig):
    """SFT of a model on chat data with tools (assistant tokens only)."""

    llm: LLMConfig = field(default_factory=LLMConfig)
    sft: SFTOptions = field(default_factory=lambda: SFTOptions(steps=100))
    save_dir: str | None = None
    """Where the trained model goes as an HF directory (default ``<output_dir>/sft_model``)."""


@job("rl.sft", SFTJobConfig)
def rl_sft(cfg: SFTJobConfig, tracker: Tracker) -> dict:
    """Supervised fine-tuning on chat data (loss on assistant tokens), saved as an HF model directory."""
    import palaestra.shared.rollout.tasks  # noqa: F401  (built-in task sources)
    from palaestra.shared.llm.base import make_client
    from palaestra.shared.rl.sft import run_sft

    client = make_client(cfg.llm)
    on_step = lambda step, loss: tracker.log_metrics({"sft/loss": loss}, step=step)  # noqa: E731
    metrics = run_sft(client.model, client.tokenizer, cfg.sft, progress=True, on_step=on_step)
    out = Path(cfg.save_dir or Path(cfg.output_dir) / "sft_model")
    client.model.save_pretrained(out)
    client.tokenizer.save_pretrained(out)
    return {**metrics, "model_dir": str(out)}
