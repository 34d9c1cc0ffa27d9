"""The trainer on the tiny model: exact resume, NaN stop, MLflow metrics, LoRA + KL, multi-agent pipelines."""

import mlflow
import numpy as np
import pytest
import torch

import palaestra.shared.rl.train  # noqa: F401  (registers rl.train)
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.llm.lora import LoraConfig
from palaestra.shared.rewards import REWARDS
from palaestra.shared.rl import checkpoint
from palaestra.shared.rl.advantages import ADVANTAGES, AdvantageStep
from palaestra.shared.rl.config import EnvSpec, OptimConfig, TrainConfig, WorkersConfig
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.trainer import Trainer, TrainingError
from palaestra.shared.rollout.env import ENVS
from palaestra.shared.testing import TakeTurns, small_train_config

METRICS = [
    "train/reward_mean",
    "train/advantage_mean",
    "train/advantage_std",
    "train/entropy",
    "train/kl",
    "train/clip_fraction",
    "train/loss",
    "perf/tokens_per_s",
    "perf/step_s",
    "perf/rollout_s",
    "perf/learner_wait_s",
]


@REWARDS.register("test_response_length")
def response_length(sample, completion, **info) -> float:
    """A dense reward so that every group has a signal."""
    return len(completion) / 10


def small_config(tmp_path, **kw) -> TrainConfig:
    kw = {"checkpoint_every": 2, "ppo_epochs": 2, "minibatch_size": 4, **kw}
    return small_train_config(tmp_path, "test_response_length", **kw)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_continues_exactly(tmp_path):
    straight = Trainer(small_config(tmp_path / "a"))
    straight.train()
    first = Trainer(small_config(tmp_path / "b", steps=2))
    first.train()
    assert checkpoint.latest(tmp_path / "b" / "out" / "checkpoints").name == "step_000002"
    resumed = Trainer(small_config(tmp_path / "b", steps=4, resume=True))
    assert resumed.step == 0  # the constructor only builds
    resumed.prepare()
    assert resumed.step == 2
    resumed.train()
    a, b = weights(straight.policies[0].model), weights(resumed.policies[0].model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and the training did move the weights
    fresh = Trainer(small_config(tmp_path / "c", steps=0))
    assert any(not torch.equal(a[k], fresh.policies[0].model.state_dict()[k]) for k in a)
    sa, sb = straight.policies[0].optimizer.state_dict(), resumed.policies[0].optimizer.state_dict()
    assert all(torch.equal(sa["state"][i]["exp_avg"], sb["state"][i]["exp_avg"]) for i in sa["state"])


def test_trainer_warms_up_from_zero(tmp_path):
    """With warmup, step 0 updates at lr 0 (the weights stay; AdamW's first step would otherwise move every
    weight by about lr), step 1 at lr / 2, and each step's rate is logged as train/lr."""
    cfg = small_config(
        tmp_path,
        steps=2,
        checkpoint_every=0,
        ppo_epochs=1,
        minibatch_size=0,
        optim=OptimConfig(lr=1e-3, warmup_steps=2),
    )
    trainer = Trainer(cfg)
    trainer.prepare()
    before = weights(trainer.policies[0].model)
    first = trainer.train_step()
    assert first["train/lr"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.policies[0].model).items())
    second = trainer.train_step()
    assert second["train/lr"] == pytest.approx(5e-4)
    assert trainer.policies[0].optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer.policies[0].model).items())
    trainer.close()


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path):
    @ADVANTAGES.register("test_nan_after_two")
    def nan_after_two(values, batch, *, calls=[0]):  # noqa: B006  (a counter across calls)
        calls[0] += 1
        return [np.full(len(r), np.nan if calls[0] > 2 else 1.0) for r in batch.turn_rewards]

    try:
        cfg = small_config(tmp_path, steps=5, checkpoint_every=1, advantages=[AdvantageStep("test_nan_after_two")])
        trainer = Trainer(cfg)
        with pytest.raises(TrainingError, match=r"non-finite loss.*step 3.*Last good checkpoint: .*step_000002"):
            trainer.train()
        assert checkpoint.latest(tmp_path / "out" / "checkpoints").name == "step_000002"
    finally:
        ADVANTAGES.unregister("test_nan_after_two")


def test_job_logs_metrics_to_mlflow(tmp_path, tracking):
    cfg = load_config(
        {
            "job": "rl.train",
            "output_dir": str(tmp_path / "out"),
            "tracking": vars(tracking),
            "rollout": {"group_size": 2, "max_tokens_per_turn": 4},
            "loss": {"kl_coef": 0.05},
            "envs": [{"name": "task", "kwargs": {"reward": "test_response_length"}}],
            "steps": 2,
            "tasks_per_step": 2,
        }
    )
    out = run_job(cfg)
    run = mlflow.MlflowClient(tracking.uri).get_run(out["run_id"])
    assert set(METRICS) <= set(run.data.metrics)
    assert run.data.metrics["train/kl"] >= 0
    assert (tmp_path / "out" / "checkpoints" / "step_000002" / "config.json").is_file()


def test_lora_with_kl_trains_adapters_only(tmp_path, tiny_llm):
    cfg = small_config(
        tmp_path, steps=1, lora=LoraConfig(enabled=True, r=4), loss=LossConfig(kl_coef=0.1), optim=OptimConfig(lr=1e-2)
    )
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.policy_state().items()}
    trainer.train()
    after = trainer.policy_state()
    assert set(before) == set(after) == set(tiny_llm.model.state_dict())  # plain names, for the workers
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all("proj" in k for k in changed)  # LoRA targets only
    assert (tmp_path / "out" / "checkpoints" / "step_000001" / "adapter_model.safetensors").is_file()


class Duel(TakeTurns):
    """Two seats alternate for 4 moves; a move whose answer starts with a digit earns its seat 0.05."""

    def move_reward(self, action):
        return 0.05 if action.strip()[:1].isdigit() else 0.0


@pytest.mark.parametrize(
    "pipeline",
    [
        [AdvantageStep("turn_level"), AdvantageStep("agent_norm")],
        [AdvantageStep("mars_code_norm")],
        [AdvantageStep("grpo"), AdvantageStep("entropy_clipped", {"span": "response"})],
    ],
    ids=["mars", "mars_code", "egpo"],
)
def test_self_play_pipelines_run(tmp_path, pipeline):
    ENVS.register("test_duel", Duel)
    try:
        cfg = small_config(
            tmp_path, steps=1, envs=[EnvSpec("test_duel")], advantages=pipeline, loss=LossConfig(dual_clip=3.0)
        )
        trainer = Trainer(cfg)
        metrics = trainer.train_step()
        assert metrics["rollout/trajectories"] == 2 * 3 * 2  # tasks x group x seats
        assert np.isfinite(metrics["train/loss"])
    finally:
        ENVS.unregister("test_duel")


def test_bad_config_fails_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="takes no argument .bogus."):
        Trainer(small_config(tmp_path, advantages=[AdvantageStep("grpo", {"scale": "group", "bogus": 1})]))


def test_merged_lora_state_equals_peft_merge_and_unload():
    import copy

    from palaestra.shared.llm import LLMConfig, make_client
    from palaestra.shared.llm.lora import with_lora

    plain = make_client(LLMConfig(model="tiny", device="cpu")).model
    original = {k: v.clone() for k, v in plain.state_dict().items()}
    model = with_lora(plain, LoraConfig(enabled=True, r=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # peft starts B at 0: make the delta non-trivial
    ours = checkpoint.merged_lora_state(model)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(ours) == set(reference)
    assert all(torch.allclose(ours[k], reference[k], atol=1e-6) for k in ours)
    changed = [k for k in ours if not torch.equal(ours[k], original[k])]
    targets = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")
    assert changed and all(k.endswith(targets) for k in changed)


@pytest.mark.slow
def test_ray_workers_with_eval_every_run_to_the_end(tmp_path, ray_local):
    # train() used to close the workers: evaluating between chunks then divided by zero workers
    cfg = small_config(
        tmp_path,
        envs=[EnvSpec("task", {"reward": "exact_answer"})],  # built in: the worker process knows it
        steps=2,
        eval_every=1,
        eval_tasks=2,
        workers=WorkersConfig(num_workers=1),
        checkpoint_every=0,
    )
    hook_steps = []

    def hook(trainer, step):
        hook_steps.append(step)
        return trainer.evaluate()

    with Trainer(cfg, eval_hook=hook) as trainer:
        trainer.prepare()
        out = trainer.train()
        assert trainer.step == 2 and hook_steps == [0, 1, 2]
        assert [s for s, _ in trainer.eval_history] == [0, 1, 2]
        assert out["eval_after_trajectories"] == 2 * 3  # eval tasks x group size, played by the worker
        cfg.steps = 3  # train() may be called again: the workers are still there
        trainer.train()
        assert trainer.step == 3 and hook_steps == [0, 1, 2, 3]
    assert trainer.rollouts is None  # closed by the context manager


def test_on_policy_step_skips_the_old_logprob_forward(tmp_path, monkeypatch):
    from palaestra.shared.rl.learner import LocalLearner

    calls = []
    real = LocalLearner.score
    monkeypatch.setattr(LocalLearner, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    egpo = [AdvantageStep("grpo"), AdvantageStep("entropy_clipped", {"span": "response"})]
    for kw, scored in [
        (dict(ppo_epochs=1, minibatch_size=0), 0),  # exactly on-policy: skipped
        (dict(ppo_epochs=2, minibatch_size=0), 1),  # a second epoch is off-policy
        (dict(ppo_epochs=1, minibatch_size=4), 1),  # so is a second minibatch
        (dict(ppo_epochs=1, minibatch_size=0, advantages=egpo), 1),  # the advantage reads entropies
    ]:
        calls.clear()
        trainer = Trainer(small_config(tmp_path, steps=1, **kw))
        metrics = trainer.train_step()
        assert len(calls) == scored, kw
        assert np.isfinite(metrics["train/loss"]) and metrics["train/entropy"] > 0
        if not scored:
            assert metrics["train/ratio_mean"] == 1.0


def test_step_with_micro_batches_and_checkpointing_runs(tmp_path):
    from palaestra.shared.rl.config import LearnerConfig

    learner = LearnerConfig(micro_batch_tokens=40, gradient_checkpointing=True)
    trainer = Trainer(small_config(tmp_path, steps=1, learner=learner, loss=LossConfig(kl_coef=0.1)))
    assert trainer.policies[0].model.model.gradient_checkpointing
    metrics = trainer.train_step()
    assert np.isfinite(metrics["train/loss"]) and metrics["train/kl"] >= 0
