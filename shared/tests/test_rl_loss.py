"""The PPO loss against TRL 1.16's own `GRPOTrainer._compute_loss` on identical tensors."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from palaestra.shared.rl.loss import LossConfig, loss_normalizer, policy_loss

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

B, T, MAX_LEN = 5, 7, 9


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logps + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)  # big enough to clip
    ref = logps + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 5, 1, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    entropies = torch.rand(B, T, generator=g, dtype=torch.float64)
    return logps, old, ref, adv, mask, entropies


class _Accel:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(loss_type, logps, old, ref, adv, mask, entropies, eps, eps_high, beta):
    """Run TRL's `_compute_loss` itself; only the model forward is replaced by the given logprobs."""
    fake = SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=eps,
        epsilon_high=eps_high,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_LEN,
        accelerator=_Accel(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropies, None)
    fake.get_high_entropy_mask = None
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if beta:
        inputs["ref_per_token_logps"] = ref
    loss = trl_grpo.GRPOTrainer._compute_loss(fake, None, inputs)
    return loss, fake._metrics["train"]


@pytest.mark.parametrize("reduction", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("eps_high", [0.2, 0.28])
def test_loss_equals_trl(reduction, beta, eps_high):
    logps, old, ref, adv, mask, ent = tensors()
    ours_logps = logps.clone().requires_grad_(True)
    trl_logps = logps.clone().requires_grad_(True)
    cfg = LossConfig(epsilon=0.2, epsilon_high=eps_high, kl_coef=beta, reduction=reduction, max_len=MAX_LEN)
    ours, metrics = policy_loss(ours_logps, old, adv, mask, cfg, ref_logps=ref, entropies=ent)
    theirs, trl_metrics = trl_loss(reduction, trl_logps, old, ref, adv, mask, ent, 0.2, eps_high, beta)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours_logps.grad, trl_logps.grad, atol=1e-6)
    assert metrics["entropy"] == pytest.approx(trl_metrics["entropy"][0], abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=1e-6)
    assert metrics["clip_fraction"] > 0  # the tensors do exercise the clip
    if beta:
        assert metrics["kl"] == pytest.approx(trl_metrics["kl"][0], abs=1e-6)


def test_on_policy_loss_is_minus_mean_advantage():
    # ratio 1 everywhere: the grpo-reduced loss is -mean_i A_i (sequences with >=1 token)
    logps, _, _, adv, mask, _ = tensors(1)
    loss, m = policy_loss(logps, logps, adv, mask, LossConfig())
    assert loss.item() == pytest.approx(-adv.mean().item())
    assert m["clip_fraction"] == 0.0


def test_dual_clip_bounds_negative_advantage_loss():
    # A = -1, ratio = e^2 (far above 1+eps): plain PPO loss = ratio * 1 = 7.39; dual clip c=3 caps it at 3
    logps = torch.tensor([[2.0]])
    old = torch.tensor([[0.0]])
    mask = torch.ones(1, 1)
    plain, _ = policy_loss(logps, old, torch.tensor([-1.0]), mask, LossConfig())
    dual, _ = policy_loss(logps, old, torch.tensor([-1.0]), mask, LossConfig(dual_clip=3.0))
    assert plain.item() == pytest.approx(torch.e**2)
    assert dual.item() == pytest.approx(3.0)
    # positive advantages are untouched by the dual clip
    pos, _ = policy_loss(logps, old, torch.tensor([1.0]), mask, LossConfig(dual_clip=3.0))
    assert pos.item() == pytest.approx(-1.2)


def test_bad_config_is_a_clear_error():
    logps, old, _, adv, mask, _ = tensors()
    with pytest.raises(ValueError, match="dr_grpo needs loss.max_len > 0"):
        policy_loss(logps, old, adv, mask, LossConfig(reduction="dr_grpo"))
    with pytest.raises(ValueError, match="reference logprobs"):
        policy_loss(logps, old, adv, mask, LossConfig(kl_coef=0.1))


@pytest.mark.parametrize("reduction", ["grpo", "dapo", "dr_grpo"])
def test_parts_with_the_minibatch_normalizer_add_up_to_the_whole(reduction):
    # rows split 2 + 3 (unequal token counts: 10 vs 12); each part divided by the whole's normalizer
    logps, old, ref, adv, mask, _ = tensors(2)
    cfg = LossConfig(kl_coef=0.04, reduction=reduction, max_len=MAX_LEN)
    whole_in = logps.clone().requires_grad_(True)
    whole, _ = policy_loss(whole_in, old, adv, mask, cfg, ref_logps=ref)
    whole.backward()
    norm = loss_normalizer(mask, cfg)
    # the normalizer by its definition, counted independently
    expected = {"grpo": B, "dapo": int(mask.sum()), "dr_grpo": B * MAX_LEN}[reduction]
    assert norm == expected
    parts_in = logps.clone().requires_grad_(True)
    total = 0.0
    for rows in (slice(0, 2), slice(2, B)):
        part, _ = policy_loss(
            parts_in[rows], old[rows], adv[rows], mask[rows], cfg, ref_logps=ref[rows], normalizer=norm
        )
        part.backward()
        total += part.item()
    assert total == pytest.approx(whole.item(), rel=1e-12)
    assert torch.allclose(parts_in.grad, whole_in.grad, rtol=1e-12, atol=0)


def test_seq_mean_token_sum_is_rolls_agg_loss_by_hand():
    # ROLL's agg_loss("seq-mean-token-sum"): masked_mean per row, mean over rows with >= 1 token.
    # Rows: tokens {1, 2} -> 1.5; no tokens -> not counted; {7, 8, 9} -> 8. Loss (1.5 + 8) / 2 = 4.75
    from palaestra.shared.rl.loss import reduce_tokens

    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    cfg = LossConfig(reduction="seq-mean-token-sum")
    assert loss_normalizer(mask, cfg) == 2
    assert reduce_tokens(per_token, mask, cfg).item() == pytest.approx(4.75)
    # grpo counts the empty row: (1.5 + 0 + 8) / 3
    assert reduce_tokens(per_token, mask, LossConfig(reduction="grpo")).item() == pytest.approx(9.5 / 3)
    # split by rows with the whole's normalizer, the parts add up
    parts = sum(reduce_tokens(per_token[r], mask[r], cfg, normalizer=2.0).item() for r in (slice(0, 2), slice(2, 3)))
    assert parts == pytest.approx(4.75)
