"""Epochs over the task data (the shared trainer's ``task_sampling: epochs``) and the documented chain
datagen -> egpo."""

from __future__ import annotations

import importlib.util
import random
from collections import Counter
from pathlib import Path

import pytest

from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config
from palaestra.shared.rl.task_sampling import TaskSampler, epoch_steps

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


def tiny_config(tmp_path, tasks: int | list[int], per_step: int, epochs: int = 2, seed: int = 0):
    counts = tasks if isinstance(tasks, list) else [tasks]
    envs = ", ".join(
        "{name: task, kwargs: {source: fc_tasks, reward: fc_binary, source_kwargs: {synthetic: " + str(n) + "}}}"
        for n in counts
    )
    overrides = [
        "job=egpo.train",
        "llm.model=tiny",
        "llm.device=cpu",
        f"output_dir={tmp_path}",
        f"tasks_per_step={per_step}",
        "task_sampling=epochs",
        f"epochs={epochs}",
        f"seed={seed}",
        f"envs=[{envs}]",
    ]
    return load_config({"job": "egpo.train"}, overrides)


def old_epoch_draw(task_counts: list[int], seed: int, per_step: int, step: int) -> list[tuple[int, int, str]]:
    """The removed ``EpochTrainer.draw_tasks`` (egpo, before the trainer took ``task_sampling``), re-written from
    its description: every (env, task) once per epoch, shuffled by ``random.Random(seed * 1_000_003 + epoch)``;
    step k takes the next ``per_step`` of the sequence. Returns (env index, reset seed, tag) per task."""
    total = sum(task_counts)
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch = k // total
        order = [(e, i) for e, count in enumerate(task_counts) for i in range(count)]
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        env_index, index = order[k % total]
        out.append((env_index, index, f"{step}-{k - step * per_step}"))
    return out


def test_epoch_steps_closed_form():
    assert epoch_steps(5, 17_000, 128) == 665  # 85,000 / 128 = 664.06 -> 665
    assert epoch_steps(1, 10, 5) == 2 and epoch_steps(3, 10, 4) == 8  # 30 / 4 = 7.5 -> 8
    with pytest.raises(ValueError, match="must be > 0"):
        epoch_steps(0, 10, 4)


def test_epoch_sampling_draws_what_the_removed_epoch_trainer_drew(tmp_path):
    cfg = tiny_config(tmp_path, tasks=[7, 5], per_step=5, epochs=3, seed=4)
    sampler = TaskSampler(cfg)
    assert sampler.task_counts == [7, 5] and sampler.steps() == epoch_steps(3, 12, 5) == 8
    for step in range(8):
        specs = sampler.draw(step)
        kwargs = [dict(env.kwargs) for env in cfg.envs]
        got = [(kwargs.index(spec.make_env.args[1]), spec.seed, spec.group_id) for spec in specs]
        assert got == old_epoch_draw([7, 5], 4, 5, step), step


def test_each_epoch_plays_every_task_once(tmp_path):
    from palaestra.shared.rl.trainer import Trainer

    cfg = tiny_config(tmp_path, tasks=10, per_step=4)
    trainer = Trainer(cfg)
    assert trainer.tasks.num_tasks == 10 and trainer.total_steps == 5  # 2 epochs x 10 / 4 -> 5 steps
    assert cfg.steps == 10  # the config is not rewritten: the run's length is derived, not written back
    drawn = [spec.seed for step in range(5) for spec in trainer.draw_tasks(step)]  # 20 draws = 2 epochs
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:]) == list(range(10))
    assert drawn[:10] != drawn[10:]  # reshuffled per epoch
    assert drawn == [spec.seed for step in range(5) for spec in trainer.draw_tasks(step)]  # a function of the step
    # with replacement (the default draw), the same 20 draws repeat some tasks and miss others
    plain = Trainer(load_config({"job": "egpo.train"}, ["llm.model=tiny", "llm.device=cpu", "task_seeds=10"]))
    counts = Counter(s.seed for step in range(5) for s in plain.draw_tasks(step))
    assert max(counts.values()) > 1


def test_epochs_without_epoch_sampling_is_a_config_error():
    with pytest.raises(ConfigError, match="task_sampling: epochs"):
        load_config({"job": "egpo.train"}, ["epochs=5"])
    with pytest.raises(ConfigError, match="task_sampling"):
        load_config({"job": "egpo.train"}, ["task_sampling=epoch"])


@pytest.mark.slow  # a datagen run (MLflow set-up included)
@pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")
def test_documented_chain_datagen_then_egpo(tmp_path, monkeypatch):
    """qwen3_4b_bfcl.yaml's multi-turn env reads the file that the datagen config its header names writes; run that
    chain tiny."""
    from palaestra.egpo.fc_tasks import fc_tasks
    from palaestra.egpo.multiturn_data import load_rows
    from palaestra.shared.jobs import run_job

    paper = load_config(EXPERIMENTS / "egpo" / "qwen3_4b_bfcl.yaml")
    data_path = next(e for e in paper.envs if e.name == "datagen_multi_turn").kwargs["path"]
    assert paper.epochs == 5
    datagen = load_config(EXPERIMENTS / "datagen" / "llm_served.yaml")
    assert Path(data_path) == datagen.output_path  # where datagen writes by default (output_dir: outputs)
    # the same chain offline at tiny scale: deterministic datagen in tmp_path, then egpo's task source on it
    monkeypatch.chdir(tmp_path)
    offline = load_config(
        EXPERIMENTS / "datagen" / "deterministic.yaml", ["num_samples=4", "workers=0", "log_samples=false"]
    )
    offline.tracking.uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_job(offline)
    path = Path(str(data_path).replace("llm_served", "deterministic"))
    assert path.is_file()
    tasks = fc_tasks(path=str(path))
    assert len(tasks) >= 4 and all(t["ground_truth"] is not None for t in tasks)
    assert len(load_rows(path)) == 4  # the multi-turn env's episodes
