"""The sharded learner on CPU: 2 Ray actors, gloo, FSDP2 and DDP, against single-process arithmetic done here."""

from __future__ import annotations

import pytest
import torch

from palaestra.shared.llm.base import LLMConfig
from palaestra.shared.rl.batch import TrainBatch
from palaestra.shared.rl.config import LearnerConfig, OptimConfig, TrainConfig
from palaestra.shared.rl.distributed import DistributedLearner, shares
from palaestra.shared.rl.logprobs import token_logprobs_and_entropy
from palaestra.shared.rl.loss import LossConfig, policy_loss
from palaestra.shared.rl.update import StepData
from palaestra.shared.rollout.engine import RolloutConfig

pytestmark = pytest.mark.slow

LENGTHS = [9, 4, 7, 12, 5]  # unequal rows and lengths: rank 0 gets 3 rows, rank 1 gets 2


def _batch(vocab: int, seed: int = 0) -> tuple[TrainBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n, width = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(3, vocab, (n, width), generator=gen)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1))
    for row, k in enumerate(LENGTHS):
        attention[row, :k] = 1
        ids[row, k:] = 0
        loss_mask[row, 2 : k - 1] = 1.0  # the first tokens are the "prompt"
    ids[1:4, :3] = ids[0, :3]  # rows 0-3 share theirs (learner.shared_prompt runs it once per micro-batch)
    turn = torch.where(loss_mask > 0, 0, -1)
    batch = TrainBatch(ids, attention, loss_mask, turn, torch.zeros_like(loss_mask, dtype=torch.bool))
    advantages = torch.randn((n, width - 1), generator=gen) * loss_mask
    return batch, advantages


def _reference_gradients(model, state, batch, idx, advantages, old, ref, cfg) -> dict[str, torch.Tensor]:
    """The unsplit minibatch's gradient in this process: one forward over all rows, the reduction as specified."""
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    rows = batch.rows(idx)
    width = rows.loss_mask.shape[1]
    logps, _ = token_logprobs_and_entropy(model, rows.input_ids, rows.attention_mask, 1.0, with_entropy=False)
    loss, _ = policy_loss(logps, old[idx, :width], advantages[idx, :width], rows.loss_mask, cfg, ref[idx, :width])
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _learner(strategy: str, lr: float, tiny_llm, micro_batch_tokens: int = 0) -> DistributedLearner:
    from palaestra.shared.testing import TEST_CLUSTER

    cfg = TrainConfig(
        llm=LLMConfig(model="tiny", device="cpu"),
        learner=LearnerConfig(world_size=2, strategy=strategy, num_cpus=1, micro_batch_tokens=micro_batch_tokens),
        optim=OptimConfig(lr=lr, max_grad_norm=0.0),
        rollout=RolloutConfig(temperature=1.0),
        cluster=TEST_CLUSTER,
    )
    initial = {k: v.clone() for k, v in tiny_llm.model.state_dict().items()}
    return DistributedLearner(cfg, initial_state=initial, reference=True)


def _assert_same(got: dict, expected: dict, rtol: float = 1e-5) -> None:
    assert got.keys() == expected.keys()
    for name, g in expected.items():
        scale = float(g.abs().max()) + 1e-12
        assert float((got[name] - g).abs().max()) / scale <= rtol, name


def test_shares_are_contiguous_and_differ_by_at_most_one_row():
    parts = shares(torch.arange(5), 2)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4]]
    assert [len(p) for p in shares(torch.arange(1), 2)] == [1, 0]


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_two_ranks_give_the_single_process_gradient_for_every_reduction(strategy, tiny_llm, ray_local):
    import copy

    model = copy.deepcopy(tiny_llm.model).train()
    batch, advantages = _batch(model.config.vocab_size)
    idx = torch.tensor([4, 0, 3, 1, 2])  # a shuffled minibatch, as the trainer's
    # a budget of 24 padded tokens: rank 0 (rows 4, 0, 3) runs 3 micro-batches, rank 1 (rows 1, 2) runs 1
    learner = _learner(strategy, lr=1e-2, tiny_llm=tiny_llm, micro_batch_tokens=24)
    try:
        for reduction in ("grpo", "dapo", "dr_grpo"):
            cfg = LossConfig(reduction=reduction, max_len=16, kl_coef=0.1, dual_clip=3.0)
            learner.cfg.loss = cfg  # the settings travel with each call
            state = learner.state_dict()
            old, _ = learner.score(batch, with_entropy=False)
            ref, _ = learner.score(batch, with_entropy=False, ref=True)
            old = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
            metrics = learner.optimizer_step(StepData(batch, advantages, old_logps=old, ref_logps=ref), idx)
            expected = _reference_gradients(model, state, batch, idx, advantages, old, ref, cfg)
            _assert_same(learner.full_gradients(), expected)
            assert metrics["tokens"] == float(batch.loss_mask.sum())
            # the step moved the weights (lr > 0), so the next reduction is checked at new weights
            assert any(not torch.equal(state[k], v) for k, v in learner.state_dict().items())
    finally:
        learner.close()


def test_gathered_state_round_trips_and_a_sharded_checkpoint_resumes_exactly(tiny_llm, ray_local, tmp_path):
    from transformers import AutoModelForCausalLM

    batch, advantages = _batch(tiny_llm.model.config.vocab_size, seed=3)
    cfg = LossConfig(reduction="dapo", kl_coef=0.1)
    idx = torch.arange(len(batch))
    learner = _learner("fsdp", lr=1e-2, tiny_llm=tiny_llm)

    def step(lrn):
        lrn.cfg.loss = cfg
        old, _ = lrn.score(batch, with_entropy=False)
        ref, _ = lrn.score(batch, with_entropy=False, ref=True)
        lrn.optimizer_step(StepData(batch, advantages, old_logps=old - 0.05, ref_logps=ref), idx)

    try:
        state = learner.state_dict()
        # before any step the gathered state is the single-process model's own
        _assert_same(state, dict(tiny_llm.model.state_dict()), rtol=0.0)
        step(learner)
        learner.save(tmp_path / "ckpt")
        saved = learner.state_dict()
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
        _assert_same(dict(reloaded.state_dict()), saved, rtol=0.0)
        step(learner)
        step(learner)  # AdamW's moments matter here: a resume without them would differ
        uninterrupted = learner.state_dict()
    finally:
        learner.close()
    resumed = _learner("fsdp", lr=1e-2, tiny_llm=tiny_llm)
    try:
        resumed.load(tmp_path / "ckpt")
        _assert_same(resumed.state_dict(), saved, rtol=0.0)
        step(resumed)
        step(resumed)
        _assert_same(resumed.state_dict(), uninterrupted, rtol=0.0)
    finally:
        resumed.close()


def test_trainer_with_two_ranks_checkpoints_the_shards_and_keeps_its_copy_in_step(tmp_path, ray_local):
    from palaestra.shared.rewards import REWARDS

    if "test_distributed_length" not in REWARDS.names():  # a dense reward: every group has a signal
        REWARDS.register("test_distributed_length")(lambda sample, completion, **info: len(completion) / 10)
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.rl.config import EnvSpec, TrainConfig
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.rollout.engine import RolloutConfig
    from palaestra.shared.testing import TEST_CLUSTER

    cfg = TrainConfig(
        job="rl.train",
        envs=[EnvSpec("task", {"source": "next_number", "reward": "test_distributed_length"})],
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        rollout=RolloutConfig(group_size=3, max_tokens_per_turn=4),
        learner=LearnerConfig(world_size=2, strategy="fsdp"),
        loss=LossConfig(kl_coef=0.1),
        optim=OptimConfig(lr=1e-3),
        cluster=TEST_CLUSTER,
        steps=1,
        tasks_per_step=2,
        ppo_epochs=2,
        minibatch_size=3,
    )
    with Trainer(cfg) as trainer:
        before = {k: v.clone() for k, v in trainer.policies[0].model.state_dict().items()}
        trainer.train()
        policy = trainer.policies[0]
        assert policy.learner is not None and policy.ref_model is None  # the ranks hold the reference
        gathered = trainer.policies[0].learner.state_dict()
        own = trainer.policies[0].model.state_dict()
        assert all(torch.equal(own[k], v) for k, v in gathered.items())
        assert any(not torch.equal(before[k], v) for k, v in gathered.items())
    ckpt = tmp_path / "out" / "checkpoints" / "step_000001"
    assert (ckpt / "sharded" / ".metadata").is_file() and (ckpt / "model.safetensors").is_file()
    assert trainer.policies[0].learner is None  # closed with the trainer
