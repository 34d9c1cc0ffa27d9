"""The learner's face (rl/learner.py) and MARS's settings in its loop: the log-prob temperature, the k3 KL clamp,
the learning rate counted in optimizer steps; each against an independent computation written here."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup

from palaestra.shared.rl.batch import TrainBatch
from palaestra.shared.rl.config import OptimConfig, TrainConfig
from palaestra.shared.rl.learner import LocalLearner, ppo_update, scoring_temperature
from palaestra.shared.rl.loss import LossConfig, policy_loss
from palaestra.shared.rl.update import StepData
from palaestra.shared.rollout.engine import RolloutConfig

LENGTHS = [9, 6, 11, 4]


def make_batch(vocab: int, seed: int = 0) -> TrainBatch:
    """Rows of LENGTHS tokens, right-padded; the model's tokens are those after the first three."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, vocab, (n,), generator=g) for n in LENGTHS]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    attention = torch.nn.utils.rnn.pad_sequence([torch.ones(n, dtype=torch.long) for n in LENGTHS], batch_first=True)
    loss_mask = attention[:, 1:].float() * (torch.arange(ids.shape[1] - 1) >= 2)
    turn = torch.where(loss_mask > 0, 0, -1)
    return TrainBatch(ids, attention, loss_mask, turn, torch.zeros_like(loss_mask, dtype=torch.bool))


def full_logits_logps(model, batch: TrainBatch, temperature: float) -> torch.Tensor:
    """Log-probs of the next tokens from the model's own full forward (HF logits / temperature), masked."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return logp * batch.loss_mask


@pytest.mark.parametrize(("setting", "expected"), [(None, 0.7), (1.0, 1.0)])
def test_logprob_temperature_is_used_for_old_new_and_reference_logprobs(tiny_llm, setting, expected):
    cfg = TrainConfig(rollout=RolloutConfig(temperature=0.7), loss=LossConfig(kl_coef=0.1, logprob_temperature=setting))
    assert scoring_temperature(cfg) == expected
    model = copy.deepcopy(tiny_llm.model)
    learner = LocalLearner(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), torch.float32, copy.deepcopy(model))
    batch = make_batch(model.config.vocab_size)
    old, _ = learner.score(batch)
    ref, _ = learner.score(batch, with_entropy=False, ref=True)
    want = full_logits_logps(model, batch, expected)
    assert torch.allclose(old, want, atol=1e-5) and torch.allclose(ref, want, atol=1e-5)
    other = full_logits_logps(model, batch, 1.7 - expected)  # the other temperature differs
    assert not torch.allclose(old, other, atol=1e-3)
    # the update's new log-probs at the same temperature: ratio 1 and no KL at unchanged weights
    adv = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2))
    m = learner.optimizer_step(StepData(batch, adv, old_logps=old, ref_logps=ref), torch.arange(len(batch)), lr=0.0)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["kl"] == pytest.approx(0.0, abs=1e-6)


def test_kl_clamp_bounds_the_k3_term_as_rolls_compute_approx_kl():
    # closed form of ROLL's k3 with its clamp: log_ratio = ref - logp; kl = exp(log_ratio) - 1 - log_ratio, in [-10, 10]
    logps = torch.tensor([[-1.0, -0.2, -6.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.0, -4.0, -0.5, -3.0]])  # ref - logp: 0, -3.8, 5.5, -2.5
    mask = torch.ones_like(ref)
    zero = torch.zeros_like(ref)
    expected = [min(10.0, math.exp(d) - 1 - d) for d in (0.0, -3.8, 5.5, -2.5)]
    assert expected[2] == 10.0  # exp(5.5) - 6.5 = 238: clamped
    cfg = LossConfig(kl_coef=1.0, reduction="dapo", kl_clamp=10.0)
    loss, m = policy_loss(logps, logps.detach(), zero, mask, cfg, ref_logps=ref)
    assert loss.item() == pytest.approx(sum(expected) / 4, rel=1e-6)
    assert m["kl"] == pytest.approx(sum(expected) / 4, rel=1e-6)
    loss.backward()
    assert logps.grad[0, 2] == 0.0  # the clamped token moves nothing, as torch.clamp's gradient
    assert logps.grad[0, 1] == pytest.approx((1 - math.exp(-3.8)) / 4, rel=1e-5)  # d/dlogp: 1 - exp(ref - logp)
    unclamped, _ = policy_loss(logps, logps.detach(), zero, mask, LossConfig(kl_coef=1.0, reduction="dapo"), ref)
    assert unclamped.item() == pytest.approx((sum(expected) - 10 + math.exp(5.5) - 6.5) / 4, rel=1e-6)


class RecordingLearner:
    """A learner that records the rate of every optimizer step (the schedule is what is tested)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg, self.rates = cfg, []

    def optimizer_step(self, data, idx, lr=None):
        self.rates.append(lr)
        return {"loss": 0.0, "tokens": float(len(idx))}


def _rows(n: int, step: int, steps: int) -> StepData:
    batch = TrainBatch(*(torch.zeros((n, 3)) for _ in range(5)))
    return StepData(batch, torch.zeros((n, 2)), step=step, steps=steps)


def test_optimizer_step_schedule_equals_transformers_cosine_stepped_per_optimizer_step():
    # ROLL's scheduler: warmup and cosine over max_steps optimizer steps, stepped after every optimizer step
    steps, rows, minibatch, epochs, warmup, lr = 5, 10, 4, 2, 3, 1e-3  # 2 epochs x 3 minibatches = 6 per RL step
    optim = OptimConfig(lr=lr, warmup_steps=warmup, schedule="cosine", schedule_unit="optimizer_step")
    cfg = TrainConfig(optim=optim, steps=steps, ppo_epochs=epochs, minibatch_size=minibatch)
    learner = RecordingLearner(cfg)
    for step in range(steps):
        ppo_update(learner, _rows(rows, step, steps))
    total = steps * epochs * math.ceil(rows / minibatch)
    assert len(learner.rates) == total == 30
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, total)
    hf = []
    for _ in range(total):
        hf.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert learner.rates == pytest.approx(hf, rel=1e-9, abs=1e-15)
    assert learner.rates[-1] < lr * 0.01  # the cosine ends at the last optimizer step


def test_rl_step_schedule_gives_every_optimizer_step_of_a_step_its_rate():
    optim = OptimConfig(lr=1e-3, warmup_steps=2, schedule="cosine")  # schedule_unit: rl_step (the default)
    cfg = TrainConfig(optim=optim, steps=4, ppo_epochs=2, minibatch_size=4)
    learner = RecordingLearner(cfg)
    for step in range(4):
        ppo_update(learner, _rows(8, step, 4))
    per_step = [learner.rates[k : k + 4] for k in range(0, 16, 4)]
    assert [len(set(r)) for r in per_step] == [1, 1, 1, 1]
    # warmup 0, 1/2; then the cosine over the 2 remaining steps: (1 + cos(0)) / 2, (1 + cos(pi / 2)) / 2
    assert [r[0] for r in per_step] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])


def test_local_learner_sets_the_rate_before_its_optimizer_step(tiny_llm):
    model = copy.deepcopy(tiny_llm.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    learner = LocalLearner(TrainConfig(), model, optimizer, torch.float32)
    batch = make_batch(model.config.vocab_size)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner.optimizer_step(StepData(batch, torch.ones(batch.loss_mask.shape)), torch.arange(len(batch)), lr=0.0)
    assert optimizer.param_groups[0]["lr"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # lr 0 moves nothing


def test_both_learners_have_the_learner_face():
    import inspect

    from palaestra.shared.rl.distributed import DistributedLearner
    from palaestra.shared.rl.learner import Learner

    face = [n for n in vars(Learner) if not n.startswith("_") and callable(getattr(Learner, n))]
    assert set(face) == {
        "score",
        "optimizer_step",
        "update",
        "set_learning_rate",
        "state_dict",
        "save",
        "load",
        "close",
    }
    for cls in (LocalLearner, DistributedLearner):
        for name in face:
            want = inspect.signature(getattr(Learner, name))
            got = inspect.signature(getattr(cls, name))
            assert list(got.parameters) == list(want.parameters), (cls.__name__, name)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("loss.kl_clamp=-1", "loss.kl_clamp': must be > 0"),
        ("loss.logprob_temperature=0", "loss.logprob_temperature': must be > 0"),
        ("optim.schedule_unit=optimizer_steps", "did you mean 'optimizer_step'"),
        ("task_sampling=epoch", "did you mean 'epochs'"),
        ("epochs=3", "3 epochs need task_sampling: epochs"),
        ("epochs=-1", "must be >= 0"),
    ],
)
def test_the_loop_settings_are_checked_when_the_config_resolves(override, message):
    import palaestra.shared.rl.train  # noqa: F401  (registers rl.train)
    from palaestra.shared.config import ConfigError
    from palaestra.shared.jobs import load_config

    with pytest.raises(ConfigError, match=message):
        load_config({"job": "rl.train"}, [override])
