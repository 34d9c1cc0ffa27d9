"""Shared prompts (rl/shared_prompt.py): the same log-probs, entropies and gradients as one forward over the rows."""

import copy

import pytest
import torch

from palaestra.shared.rl.batch import TrainBatch, micro_batches
from palaestra.shared.rl.learner import model_forward
from palaestra.shared.rl.logprobs import token_logprobs_and_entropy
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.update import StepData, accumulate, score_rows, token_means

# (prompt, completion length): prompt "a" is a group of 4, "b" of 3; "c" and "a+" (a's prompt and one more
# token) are one row each, so they share with nobody
ROWS = [("a", 9), ("b", 4), ("a", 3), ("c", 6), ("a", 12), ("b", 8), ("a", 5), ("a+", 4), ("b", 2)]
GAP_ROW = 4  # a second turn: 3 environment tokens inside its completion are not scored


def make_batch(vocab: int, seed: int = 0) -> TrainBatch:
    """Right-padded rows: a prompt, then the model's tokens (loss mask 1), of unequal lengths."""
    g = torch.Generator().manual_seed(seed)
    prompts = {name: torch.randint(3, vocab, (n,), generator=g) for name, n in (("a", 6), ("b", 3), ("c", 5))}
    prompts["a+"] = torch.cat([prompts["a"], torch.randint(3, vocab, (1,), generator=g)])
    lengths = [len(prompts[p]) + n for p, n in ROWS]
    width = max(lengths)
    ids = torch.zeros(len(ROWS), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros(len(ROWS), width - 1)
    for row, ((name, n), length) in enumerate(zip(ROWS, lengths)):
        p = len(prompts[name])
        ids[row, :p] = prompts[name]
        ids[row, p:length] = torch.randint(3, vocab, (n,), generator=g)
        attention[row, :length] = 1
        loss_mask[row, p - 1 : length - 1] = 1  # target position j scores token j + 1
    loss_mask[GAP_ROW, 10:13] = 0
    turn = torch.where(loss_mask > 0, 0, -1)
    return TrainBatch(ids, attention, loss_mask, turn, torch.zeros_like(loss_mask, dtype=torch.bool))


def full_logits(model, batch, temperature):
    """Independent reference: the HF model's own logits over the whole rows."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1] / temperature
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    logps = logp_all.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return logps, -(logp_all.exp() * logp_all).sum(-1)


def decoder_batches(model):
    """Record the (rows, tokens) of every decoder call (its embedding lookups)."""
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    return seen, hook


def test_logprobs_and_entropies_equal_the_plain_forward(tiny_llm):
    model = copy.deepcopy(tiny_llm.model).double().eval()
    batch = make_batch(model.config.vocab_size)
    scored = batch.loss_mask > 0
    with torch.no_grad():
        plain_lp, plain_ent = token_logprobs_and_entropy(
            model, batch.input_ids, batch.attention_mask, 0.7, positions=scored
        )
        seen, hook = decoder_batches(model)
        lp, ent = token_logprobs_and_entropy(
            model, batch.input_ids, batch.attention_mask, 0.7, positions=scored, shared_prompt=True
        )
        hook.remove()
        ref_lp, ref_ent = full_logits(model, batch, 0.7)
    # one forward over the 4 distinct prompts (their tokens before the first scored position), then the 9 rows
    assert seen == [(4, 6), (len(ROWS), 13)]
    assert torch.allclose(lp, plain_lp, rtol=1e-10, atol=1e-10)
    assert torch.allclose(ent, plain_ent, rtol=1e-10, atol=1e-10)
    assert torch.allclose(lp[scored], ref_lp[scored], rtol=1e-10, atol=1e-10)
    assert torch.allclose(ent[scored], ref_ent[scored], rtol=1e-10, atol=1e-10)
    assert not lp[~scored].any() and not ent[~scored].any()


def test_float32_scoring_in_micro_batches_matches_the_plain_forward(tiny_llm):
    model = copy.deepcopy(tiny_llm.model).eval()
    batch = make_batch(model.config.vocab_size)
    rows = torch.arange(len(batch))
    plain_lp, plain_ent = score_rows(model_forward(model, 1.0), batch, rows)
    lp, ent = score_rows(model_forward(model, 1.0, shared_prompt=True), batch, rows, max_rows=4)
    scored = batch.loss_mask > 0
    assert torch.allclose(lp, plain_lp, rtol=1e-5, atol=1e-5) and lp[scored].abs().min() > 0
    assert torch.allclose(ent, plain_ent, rtol=1e-5, atol=1e-5)


def grads(model, batch, idx, cfg, budget, shared, old, ref, adv):
    model.zero_grad(set_to_none=True)
    data = StepData(batch, adv, old_logps=old, ref_logps=ref)
    metrics = token_means(accumulate(model_forward(model, 0.7, shared), data, idx, cfg, budget, "cpu"))
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, metrics


def loss_inputs(batch: TrainBatch):
    g = torch.Generator().manual_seed(1)
    shape = batch.loss_mask.shape
    old = (-torch.rand(shape, generator=g) * 6 - 2).double()  # far from the model's: the clip is exercised
    ref = (-torch.rand(shape, generator=g) * 6 - 2).double()
    adv = torch.randn(len(batch), generator=g, dtype=torch.float64)[:, None].expand(shape).contiguous()
    return old, ref, adv


def assert_same(got: dict, want: dict, rel: float) -> None:
    assert set(got) == set(want) and want
    for k in want:
        assert torch.linalg.norm(got[k] - want[k]) <= rel * torch.linalg.norm(want[k]), k


@pytest.mark.parametrize("reduction", ["grpo", "dapo", "dr_grpo"])
def test_gradients_equal_the_unshared_ones_with_groups_split_across_micro_batches(tiny_llm, reduction):
    model = copy.deepcopy(tiny_llm.model).double().train()
    batch = make_batch(model.config.vocab_size)
    old, ref, adv = loss_inputs(batch)
    cfg = LossConfig(kl_coef=0.1, dual_clip=3.0, reduction=reduction, max_len=16)
    idx = torch.arange(len(batch))
    budget = 60
    parts = [p.tolist() for p in micro_batches(batch, idx, budget)]
    groups_in = [{ROWS[i][0] for i in p} for p in parts]
    assert len(parts) >= 3 and sum("a" in g for g in groups_in) >= 2  # group "a" is split across micro-batches
    assert any(sum(ROWS[i][0] == "a" for i in p) >= 2 for p in parts)  # and shares within one of them
    want, m_want = grads(model, batch, idx, cfg, 0, False, old, ref, adv)
    got, m_got = grads(model, batch, idx, cfg, budget, True, old, ref, adv)
    whole, m_whole = grads(model, batch, idx, cfg, 0, True, old, ref, adv)  # every group in one micro-batch
    # float64, but the model's RMSNorms compute in float32: a float32 rounding of a gradient may differ
    assert_same(got, want, 1e-6)
    assert_same(whole, want, 1e-6)
    for m in (m_got, m_whole):
        assert m["loss"] == pytest.approx(m_want["loss"], rel=1e-9)
        assert m["entropy"] == pytest.approx(m_want["entropy"], rel=1e-9)  # entropies from the same forward
    assert m_want["clip_fraction"] > 0


def test_float32_gradients_within_1e5_and_with_gradient_checkpointing(tiny_llm):
    model = copy.deepcopy(tiny_llm.model).train()
    batch = make_batch(model.config.vocab_size)
    old, ref, adv = (x.float() for x in loss_inputs(batch))
    cfg = LossConfig(kl_coef=0.1, reduction="dapo")
    idx = torch.arange(len(batch))
    want, _ = grads(model, batch, idx, cfg, 0, False, old, ref, adv)
    got, _ = grads(model, batch, idx, cfg, 0, True, old, ref, adv)
    assert_same(got, want, 1e-5)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpointed, _ = grads(model, batch, idx, cfg, 0, True, old, ref, adv)
    assert_same(checkpointed, want, 1e-5)  # the layers kept the prompt cache: without it the gradient differs
    assert all("_can_checkpoint_with_cache" not in layer.__dict__ for layer in model.model.layers)


def test_a_model_that_cannot_share_runs_the_plain_forward_with_a_warning(tiny_llm):
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(tiny_llm.model.config)  # the same model with sliding-window layers (as Mistral's)
    config.use_sliding_window, config.sliding_window = True, 64
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    model = AutoModelForCausalLM.from_config(config).double().eval()
    batch = make_batch(model.config.vocab_size)
    scored = batch.loss_mask > 0
    with torch.no_grad():
        seen, hook = decoder_batches(model)
        with pytest.warns(UserWarning, match=r"shared_prompt: \w+ runs the plain forward.*sliding_attention"):
            lp, _ = token_logprobs_and_entropy(
                model, batch.input_ids, batch.attention_mask, 1.0, positions=scored, shared_prompt=True
            )
        hook.remove()
    assert seen == [tuple(batch.input_ids.shape)]
    assert lp[scored].abs().min() > 0
    with pytest.raises(ValueError, match="shared_prompt needs the scored positions"):
        token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, shared_prompt=True)


def test_the_learner_setting_reaches_the_update(tiny_llm):
    from palaestra.shared.rl.config import TrainConfig
    from palaestra.shared.rl.learner import LocalLearner

    batch = make_batch(tiny_llm.model.config.vocab_size)
    _, _, adv = loss_inputs(batch)
    weights = {}
    for shared in (True, False):
        model = copy.deepcopy(tiny_llm.model).train()
        cfg = TrainConfig()
        cfg.learner.shared_prompt, cfg.optim.lr = shared, 0.5
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        seen, hook = decoder_batches(model)
        LocalLearner(cfg, model, optimizer, torch.float32).update(StepData(batch, adv.float()))
        hook.remove()
        assert seen == ([(4, 6), (len(ROWS), 13)] if shared else [tuple(batch.input_ids.shape)])
        weights[shared] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.equal(weights[True], torch.cat([p.flatten() for p in tiny_llm.model.parameters()]))
    assert torch.allclose(weights[True], weights[False], rtol=0, atol=1e-6)


def test_sliding_window_without_layer_types_falls_back_to_the_plain_forward():
    """Mistral-family configs slide on every layer through `sliding_window` alone: prompts of two lengths in one
    micro-batch put a row's tokens after padding, which the window (counted in cache columns) must not see past."""
    from transformers import MistralConfig, MistralForCausalLM

    from palaestra.shared.rl.shared_prompt import unsupported

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=4,
        max_position_embeddings=64,
    )
    assert not getattr(config, "layer_types", None)  # the case: the window is on the config only
    model = MistralForCausalLM(config).double().eval()
    assert "sliding_window=4" in unsupported(model)
    g = torch.Generator().manual_seed(1)
    short, long = torch.randint(3, 64, (3,), generator=g), torch.randint(3, 64, (8,), generator=g)
    spec = [(short, 10), (short, 7), (long, 12), (long, 6)]  # two groups; every row is longer than the window
    rows = [torch.cat([p, torch.randint(3, 64, (n,), generator=g)]) for p, n in spec]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    scored = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for i, ((prompt, _), row) in enumerate(zip(spec, rows)):
        ids[i, : len(row)], attention[i, : len(row)] = row, 1
        scored[i, len(prompt) - 1 : len(row) - 1] = True
    with torch.no_grad(), pytest.warns(UserWarning, match="sliding_window"):
        lp, _ = token_logprobs_and_entropy(model, ids, attention, 1.0, positions=scored, shared_prompt=True)
        # independent reference: each row alone through the HF model, no padding, no sharing
        for i, row in enumerate(rows):
            logits = model(input_ids=row[None]).logits[0, :-1]
            want = torch.log_softmax(logits, -1).gather(-1, row[1:, None]).squeeze(-1)
            assert torch.allclose(lp[i, scored[i]], want[scored[i, : len(row) - 1]], atol=1e-10), i
