"""The learner's optimizer step: micro-batched gradients equal the unsplit ones; the split itself."""

import pytest
import torch

from palaestra.shared.rl.batch import TrainBatch, micro_batches
from palaestra.shared.rl.learner import model_forward
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.update import StepData, accumulate, score_rows, token_means

LENGTHS = [14, 5, 9, 3, 11, 7]


def make_batch(vocab: int, seed: int = 0) -> TrainBatch:
    """Right-padded rows of unequal lengths; the first 2 tokens of each row are the prompt (no loss)."""
    g = torch.Generator().manual_seed(seed)
    n, width = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(3, vocab, (n, width), generator=g)
    attention = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    ids[attention == 0] = 0
    loss_mask = attention[:, 1:].float().clone()
    loss_mask[:, :1] = 0  # target position 0 is the second prompt token
    turn = torch.where(loss_mask > 0, 0, -1)
    return TrainBatch(ids, attention, loss_mask, turn, torch.zeros_like(loss_mask, dtype=torch.bool))


def inputs(batch: TrainBatch, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    shape = batch.loss_mask.shape
    old = -torch.rand(shape, generator=g) * 6 - 2  # far from the model's: the clip is exercised
    ref = -torch.rand(shape, generator=g) * 6 - 2
    adv = torch.randn(len(batch), generator=g)[:, None].expand(shape).contiguous()
    return old, ref, adv


def grads_of(model, batch, idx, cfg, budget, old, ref, adv):
    model.zero_grad(set_to_none=True)
    data = StepData(batch, adv, old_logps=old, ref_logps=ref, entropies=torch.ones_like(ref))
    metrics = token_means(accumulate(model_forward(model, 0.7), data, idx, cfg, budget, "cpu"))
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, metrics


def test_micro_batches_respect_the_budget_and_cover_every_row():
    batch = make_batch(50)
    idx = torch.tensor([5, 0, 3, 1, 4, 2])
    parts = micro_batches(batch, idx, max_tokens=20)
    assert sorted(torch.cat(parts).tolist()) == sorted(idx.tolist())
    for p in parts:
        width = max(LENGTHS[i] for i in p.tolist())
        assert len(p) == 1 or len(p) * width <= 20  # a lone row may exceed the budget (never cut)
    assert [p.tolist() for p in parts] == [[0], [4], [2, 5], [1, 3]]  # longest first, packed greedily
    assert [p.tolist() for p in micro_batches(batch, idx, max_rows=4)] == [[0, 4, 2, 5], [1, 3]]
    assert micro_batches(batch, idx)[0] is idx


@pytest.mark.parametrize("reduction", ["grpo", "dapo", "dr_grpo"])
def test_micro_batched_gradients_equal_the_unsplit_ones(tiny_llm, reduction):
    import copy

    model = copy.deepcopy(tiny_llm.model).double().train()
    batch = make_batch(model.config.vocab_size)
    old, ref, adv = (x.double() for x in inputs(batch))
    cfg = LossConfig(kl_coef=0.1, dual_clip=3.0, reduction=reduction, max_len=16)
    idx = torch.tensor([4, 1, 0, 5, 2])  # a minibatch of 5 of the 6 rows
    whole, m_whole = grads_of(model, batch, idx, cfg, 0, old, ref, adv)
    parts = micro_batches(batch, idx, 24)
    tokens = [float(batch.loss_mask[p].sum()) for p in parts]
    assert len(parts) >= 3 and len(set(tokens)) > 1  # really split, with unequal token counts
    split, m_split = grads_of(model, batch, idx, cfg, 24, old, ref, adv)
    assert set(whole) == set(split) and whole
    for k in whole:
        assert torch.linalg.norm(split[k] - whole[k]) <= 1e-6 * torch.linalg.norm(whole[k]), k
    assert m_split["loss"] == pytest.approx(m_whole["loss"], rel=1e-6)
    assert m_split["clip_fraction"] == pytest.approx(m_whole["clip_fraction"], rel=1e-6)
    assert m_whole["clip_fraction"] > 0


def saved_elements(model, batch) -> int:
    """Elements of the tensors autograd keeps for the backward of one forward through the decoder."""
    count = [0]

    def pack(t):
        count[0] += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    return count[0]


def test_gradient_checkpointing_gives_the_same_gradients(tiny_llm):
    import copy

    model = copy.deepcopy(tiny_llm.model).double().train()
    batch = make_batch(model.config.vocab_size)
    old, ref, adv = (x.double() for x in inputs(batch))
    cfg = LossConfig(kl_coef=0.1, reduction="dapo")
    idx = torch.arange(len(batch))
    plain, _ = grads_of(model, batch, idx, cfg, 30, old, ref, adv)
    saved_plain = saved_elements(model, batch)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert saved_elements(model, batch) * 10 < saved_plain  # the layers' activations are not kept
    checkpointed, _ = grads_of(model, batch, idx, cfg, 30, old, ref, adv)
    assert set(plain) == set(checkpointed)
    for k in plain:
        assert torch.linalg.norm(checkpointed[k] - plain[k]) <= 1e-10 * torch.linalg.norm(plain[k]), k


def test_learner_dtype_settings_are_validated():
    from palaestra.shared.config import ConfigError
    from palaestra.shared.llm import LLMConfig
    from palaestra.shared.rl.config import LearnerConfig, learner_dtypes

    assert learner_dtypes(LearnerConfig(), LLMConfig(), "cpu") == "float32"
    assert learner_dtypes(LearnerConfig(), LLMConfig(), "cuda") == "bfloat16"
    assert learner_dtypes(LearnerConfig(compute_dtype="float32"), LLMConfig(), "cuda") == "float32"
    with pytest.raises(ConfigError, match="bfloat16 needs a GPU"):
        learner_dtypes(LearnerConfig(compute_dtype="bfloat16"), LLMConfig(), "cpu")
    with pytest.raises(ConfigError, match="float32 master weights"):
        learner_dtypes(LearnerConfig(), LLMConfig(dtype="bfloat16"), "cuda")
    with pytest.raises(ConfigError, match="unknown dtype 'fp8'"):
        learner_dtypes(LearnerConfig(compute_dtype="fp8"), LLMConfig(), "cuda")


@pytest.mark.parametrize("reduction", ["grpo", "dapo", "dr_grpo"])
def test_on_policy_update_without_old_logprobs_gives_the_same_gradients(tiny_llm, reduction):
    # one epoch, one minibatch: the old log-probs equal the current ones, so the trainer may skip scoring
    import copy

    model = copy.deepcopy(tiny_llm.model).double().train()
    batch = make_batch(model.config.vocab_size)
    _, ref, adv = (x.double() for x in inputs(batch))
    cfg = LossConfig(kl_coef=0.1, dual_clip=3.0, reduction=reduction, max_len=16)
    idx = torch.arange(len(batch))
    scored, _ = score_rows(model_forward(model, 0.7), batch, idx, with_entropy=False)
    with_old, m_old = grads_of(model, batch, idx, cfg, 20, scored.double(), ref, adv)
    skipped, m_skip = grads_of(model, batch, idx, cfg, 20, None, ref, adv)
    for k in with_old:
        assert torch.linalg.norm(skipped[k] - with_old[k]) <= 1e-6 * torch.linalg.norm(with_old[k]), k
    assert m_skip["ratio_mean"] == 1.0 and m_skip["clip_fraction"] == 0.0
    assert m_skip["loss"] == pytest.approx(m_old["loss"], rel=1e-6)


def test_a_negative_micro_batch_budget_is_a_config_error(tmp_path):
    from palaestra.shared.config import ConfigError
    from palaestra.shared.rl.config import LearnerConfig, TrainConfig
    from palaestra.shared.rl.trainer import Trainer

    with pytest.raises(ConfigError, match="learner.micro_batch_tokens must be >= 0"):
        Trainer(TrainConfig(output_dir=str(tmp_path), learner=LearnerConfig(micro_batch_tokens=-1)))
