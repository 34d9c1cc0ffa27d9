"""Several policies, each with its own sharded learner (rl/trainer.py `start_learner`, rl/distributed.py) on CPU:
2 Ray ranks per policy, gloo, tiny. Policy a shards with FSDP2 under the run's learner settings, policy b has its
own learner (DDP) and optimizer (another learning rate). Checked against the in-process learners (world size 1) on
the same rows, a resume from the per-policy sharded checkpoints against the run that went on, and one declared
sharded policy against the sharded run without a section."""

from __future__ import annotations

import shutil

import pytest
import torch

from palaestra.shared.config import ConfigError, TrackingConfig
from palaestra.shared.llm.lora import LoraConfig
from palaestra.shared.rl.advantages import AdvantageStep
from palaestra.shared.rl.config import EnvSpec, LearnerConfig, OptimConfig, PolicySpec, TrainConfig
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import RolloutConfig, RolloutResult
from palaestra.shared.rollout.env import ENVS
from palaestra.shared.testing import TEST_CLUSTER, TakeTurns

torch.set_num_threads(1)
ENV = "test_policies_sharded_duel"
GRADIENT_RTOL = 1e-5  # test_distributed.py's sharded-vs-single-process tolerance on a step's gradient
UPDATE_RTOL = 1e-3
"""On the weights after two RL steps: |sharded update - in-process update| / |in-process update| (Frobenius, over
all tensors; 3e-5 measured). Not the gradients' max-norm measure: AdamW's first step moves each weight by
lr * g / (|g| + 1e-8), so an element whose gradient is near zero turns a rounding-level difference of g into up to
lr; a wrong gradient (rows lost or counted twice) flips the signs of many elements and misses this by far."""


class Duel(TakeTurns):
    """Each move earns its seat its answer's distinct characters / 10 (a dense reward, so every group's
    advantages differ: the updates are the policy gradient's, not rounding's)."""

    def move_reward(self, action):
        return len(set(action)) / 10


@pytest.fixture(scope="module", autouse=True)
def duel_env():
    ENVS.register(ENV, Duel)
    yield
    ENVS.unregister(ENV)


def learner(world_size: int, strategy: str = "fsdp") -> LearnerConfig:
    # 2 policies x 2 ranks x 0.5 CPU: TEST_CLUSTER's 2 CPUs
    return LearnerConfig(world_size=world_size, strategy=strategy, num_cpus=0.5)


def config(out, world_size: int, **kw) -> TrainConfig:
    policies = {
        "a": PolicySpec(agents=["p0"]),
        "b": PolicySpec(agents=["p1"], optim=OptimConfig(lr=3e-4), learner=learner(world_size, "ddp")),
    }
    base = dict(
        envs=[EnvSpec(ENV)],
        job="rl.train",
        output_dir=str(out),
        tracking=TrackingConfig(enabled=False),
        rollout=RolloutConfig(group_size=2, max_tokens_per_turn=4, temperature=1.0),
        advantages=[AdvantageStep("turn_level", {"gamma": 1.0}), AdvantageStep("agent_norm")],
        loss=LossConfig(epsilon=0.2, dual_clip=1.4, kl_coef=0.1),  # a reference per policy, on its ranks
        optim=OptimConfig(lr=1e-3),
        learner=learner(world_size),
        cluster=TEST_CLUSTER,
        policies=policies,
        steps=2,
        tasks_per_step=2,
        checkpoint_every=1,
        ppo_epochs=1,  # one optimizer step per RL step: its gradient, at the step's start weights, is comparable
    )
    base.update(kw)
    return TrainConfig(**base)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_relative_difference(got: dict, expected: dict) -> float:
    """The largest, over tensors, of max |got - expected| / max |expected| (test_distributed.py's measure)."""
    assert got.keys() == expected.keys()
    return max(float((got[k] - e).abs().max()) / (float(e.abs().max()) + 1e-12) for k, e in expected.items())


def update_difference(got: dict, expected: dict, before: dict) -> float:
    """|got - expected| / |expected - before| over all tensors (Frobenius): how far two updates from `before` differ."""
    num = sum(float(((got[k] - expected[k]) ** 2).sum()) for k in before)
    return (num / sum(float(((expected[k] - before[k]) ** 2).sum()) for k in before)) ** 0.5


@pytest.fixture(scope="module")  # the slow tests': Ray actors, each loading the model
def sharded_run(tmp_path_factory, ray_local):
    """Two steps of two sharded policies (a checkpoint after each, as ``checkpoint_every: 1``): the rows each step
    trained on, the weights before and after, each policy's first gradient."""
    out = tmp_path_factory.mktemp("sharded") / "out"
    trainer = Trainer(config(out, 2))
    seen: list[RolloutResult] = []
    select = trainer.batch_rule.select
    trainer.batch_rule.select = lambda step, result: seen.append(select(step, result)) or seen[-1]
    before = weights(trainer.policies[0].model)
    with trainer:
        trainer.prepare()
        assert [type(p.learner).__name__ for p in trainer.policies] == ["DistributedLearner"] * 2
        assert all(p.ref_model is None for p in trainer.policies)  # each policy's ranks hold its reference
        trainer.train_step()
        gradients = {p.name: p.learner.full_gradients() for p in trainer.policies}
        trainer.save()
        trainer.train_step()
        trainer.save()
        gathered = {p.name: p.learner.state_dict() for p in trainer.policies}
        after = {p.name: weights(p.model) for p in trainer.policies}
    assert all(p.learner is None for p in trainer.policies)  # closed with the trainer
    # the trainer's copies are the ranks' weights (refreshed after every update)
    for name, state in gathered.items():
        assert max_relative_difference(after[name], state) == 0.0, name
    return {"out": out, "seen": seen, "before": before, "after": after, "gradients": gradients}


@pytest.mark.slow
def test_two_sharded_policies_train_as_two_in_process_policies_on_the_same_rows(sharded_run, tmp_path):
    seen, before, after = sharded_run["seen"], sharded_run["before"], sharded_run["after"]
    assert {t.agent for r in seen for t in r.trajectories} == {"p0", "p1"}
    local = Trainer(config(tmp_path / "out", 1))
    local.batch_rule.select = lambda step, result: seen[step]  # the sharded run's rows, step by step
    with local:
        local.train_step()
        assert [type(p.learner).__name__ for p in local.policies] == ["LocalLearner"] * 2
        # the gradient of each policy's step from the same weights on the same rows
        gradients = {p.name: {k: q.grad.clone() for k, q in p.model.named_parameters()} for p in local.policies}
        local.train_step()
        expected = {p.name: weights(p.model) for p in local.policies}
    for name in ("a", "b"):
        assert max_relative_difference(sharded_run["gradients"][name], gradients[name]) <= GRADIENT_RTOL, name
        assert update_difference(after[name], expected[name], before) <= UPDATE_RTOL, name
    # each moved by its own learning rate (AdamW: at most about lr per weight and step): a's 1e-3, b's 3e-4
    for name, lr in (("a", 1e-3), ("b", 3e-4)):
        moved = max(float((after[name][k] - before[k]).abs().max()) for k in before)
        assert lr < moved <= 2.5 * lr, name


@pytest.mark.slow
def test_each_sharded_policy_resumes_from_its_own_shards_exactly(sharded_run, tmp_path):
    ckpts = sharded_run["out"] / "checkpoints"
    first = ckpts / "step_000001"
    for name in ("a", "b"):  # each policy's shards in its subdirectory, its reference in its own
        assert (first / name / "sharded" / ".metadata").is_file() and (first / name / "optimizer.pt").is_file()
        assert (ckpts / "policies" / name / "reference" / "model.safetensors").is_file()
    assert not (first / "sharded").exists()
    # the checkpoint after step 1 alone (the run that wrote it went on to step 2)
    out = tmp_path / "out"
    shutil.copytree(first, out / "checkpoints" / first.name)
    shutil.copytree(ckpts / "policies", out / "checkpoints" / "policies")
    resumed = Trainer(config(out, 2, resume=True))
    with resumed:
        resumed.train()
        assert resumed.step == 2
        got = {p.name: weights(p.model) for p in resumed.policies}
    # bit for bit; AdamW's moments on the ranks matter: ranks restarted from the weights alone would differ
    for name in ("a", "b"):
        assert max_relative_difference(got[name], sharded_run["after"][name]) == 0.0, name


@pytest.mark.slow
def test_one_declared_sharded_policy_is_the_sharded_run_without_a_section_bit_for_bit(tmp_path, ray_local):
    runs = []
    for out, policies in ((tmp_path / "plain", {}), (tmp_path / "one", {"solo": PolicySpec()})):
        with Trainer(config(out, 2, policies=policies, steps=1, learner=learner(2, "fsdp"))) as trainer:
            before = weights(trainer.policies[0].model)
            metrics = trainer.train_step()
            runs.append(
                ({k: v for k, v in metrics.items() if not k.startswith("perf/")}, weights(trainer.policies[0].model))
            )
    assert runs[0][0] == runs[1][0]
    assert max_relative_difference(runs[0][1], runs[1][1]) == 0.0
    assert max_relative_difference(runs[0][1], before) > 0.0  # the step did train


def test_lora_on_a_policys_sharded_learner_is_refused(tmp_path):
    lora = {"b": PolicySpec(agents=["p1"], lora=LoraConfig(enabled=True), learner=learner(2))}
    with pytest.raises(ConfigError, match="policy b: learner.world_size > 1 does not support LoRA"):
        Trainer(config(tmp_path, 1, policies={"a": PolicySpec(agents=["p0"]), **lora}))


def test_plan_counts_each_sharded_policys_ranks_and_copies():
    """Each sharded policy on ranks of its own: a learner device holds the largest policy's rank (the plan of that
    policy alone), the GPUs add up, and the trainer's GPU holds every policy's float32 copy and, while it makes the
    reference, its bf16 copy (4 + 2 bytes per parameter each); a sharded policy beside an in-process one has its own
    ranks."""
    from palaestra.shared.config import resolve
    from palaestra.shared.plan import plan
    from palaestra.shared.plan_memory import GB, model_arch

    base = {"job": "rl.train", "llm": {"model": "smollm2-135m", "device": "cuda"}, "loss": {"kl_coef": 0.01}}
    sharded = {"world_size": 2, "num_gpus": 1, "gradient_checkpointing": True, "micro_batch_tokens": 8192}

    def report(data) -> dict[str, str]:
        text, _ = plan(resolve(TrainConfig, data), gpu_gb=1000.0, gpus=16)
        return {line.split()[0]: line for line in text.splitlines()} | {"text": text}

    def gb(line: str, word: str) -> float:
        return float(line.split(word)[1].split()[0])

    one = report({**base, "learner": sharded})
    two = report({**base, "learner": sharded, "policies": {"a": {"agents": ["p0"]}, "b": {"agents": ["p1"]}}})
    assert two["total"] == one["total"]  # one rank holds one policy's shard, as the run of one policy
    assert "GPUs: 4 learner + 0 rollout + 1 trainer process = 5" in two["text"]
    params = model_arch("smollm2-135m")[0].params()
    assert gb(two["trainer"], "learners") == pytest.approx(2 * gb(one["trainer"], "it saves"), abs=0.011)
    assert gb(two["trainer"], "learners") == pytest.approx(2 * (4 + 2) * params / GB, abs=0.011)
    big = {"agents": ["p1"], "llm": {"model": "Qwen/Qwen3-4B", "device": "cuda"}}
    mixed = report({**base, "learner": sharded, "policies": {"a": {"agents": ["p0"]}, "b": big}})
    alone = report({**base, "llm": big["llm"], "learner": sharded})
    assert mixed["total"] == alone["total"]  # the larger policy's rank
    # the run's learner in process, policy b on 2 ranks of its own: its copies join the in-process learner's GPU
    beside = {"a": {"agents": ["p0"]}, "b": {"agents": ["p1"], "learner": sharded}}
    in_process = {**base, "learner": {k: v for k, v in sharded.items() if k not in ("world_size", "num_gpus")}}
    both = report({**in_process, "policies": beside})
    first = report(in_process)
    assert float(both["total"].split()[1]) - float(first["total"].split()[1]) == pytest.approx(
        (4 + 2) * params / GB, abs=0.011
    )
    assert "b (smollm2-135m): 2 ranks x 1 GPU, fsdp, per rank" in both["text"]
    assert "GPUs: 3 learner + 0 rollout = 3" in both["text"]
