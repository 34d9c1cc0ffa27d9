"""Chunked log-probs and entropies: equal to the full-logits computation, with a fraction of its peak memory."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from palaestra.shared.rl.logprobs import token_logprobs_and_entropy


def full_logits_path(model, ids, attention, temperature, with_entropy=True):
    """The learner's computation before chunking (kept here as the reference): three (B, L, V) float32 tensors."""
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # .float(), but float64 stays
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logps = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy


def test_chunked_logprobs_entropies_and_gradients_equal_the_full_ones(tiny_llm):
    import copy

    model = copy.deepcopy(tiny_llm.model).double().train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 17), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 11:] = 0
    weights = torch.randn(3, 16, generator=g, dtype=torch.float64)
    chunk = 5 * model.config.vocab_size  # 5 positions per chunk: 48 positions in 10 chunks, checkpointed

    def run(fn, **kw):
        model.zero_grad(set_to_none=True)
        logps, ent = fn(model, ids, attention, 0.7, **kw)
        (logps * weights).sum().backward()
        return logps.detach(), ent, {k: p.grad.clone() for k, p in model.named_parameters()}

    ref_lp, ref_ent, ref_grad = run(full_logits_path)
    lp, ent, grad = run(token_logprobs_and_entropy, chunk_elements=chunk)
    assert lp.shape == ent.shape == (3, 16) and not ent.requires_grad
    assert torch.allclose(lp, ref_lp, rtol=1e-6, atol=1e-6)
    assert torch.allclose(ent, ref_ent, rtol=1e-6, atol=1e-6)
    for k in ref_grad:
        assert torch.linalg.norm(grad[k] - ref_grad[k]) <= 1e-6 * torch.linalg.norm(ref_grad[k]), k


# Peak resident memory of one call in a fresh process. Linux resets the peak (VmHWM) on
# `echo 5 > /proc/self/clear_refs`; a fixed malloc mmap threshold sends every large tensor to its own
# mapping, returned on free, so the peak is what the tensors alive at once occupy, not allocator history.
PEAK_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    sys.path.insert(0, sys.argv[2])
    from test_trainer_logprobs import full_logits_path
    from palaestra.shared.rl.logprobs import token_logprobs_and_entropy
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(cfg)
    ids = torch.randint(0, 32000, (1, 2048))
    fn = full_logits_path if sys.argv[1] == "full" else token_logprobs_and_entropy
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    def train():
        logps, _ = fn(model, ids, torch.ones_like(ids), 0.7, with_entropy=False)
        logps.sum().backward()
    def score():
        with torch.no_grad():
            fn(model, ids, torch.ones_like(ids), 0.7, with_entropy=True)
    for run in (train, score):
        model.zero_grad(set_to_none=True)
        open("/proc/self/clear_refs", "w").write("5")
        base = hwm()
        run()
        print(run.__name__, hwm() - base)
    """
)


def peak_bytes(path: str) -> dict[str, int]:
    """Peak bytes above the resident set before the call: ``train`` (forward + backward of the log-probs)
    and ``score`` (log-probs and entropies without gradient)."""
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, path, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        env={**env, **{k: v for k, v in __import__("os").environ.items() if k not in env}},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split() for line in out.stdout.splitlines() if line.startswith(("train ", "score "))]
    return {name: int(value) for name, value in lines}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
def test_peak_memory_at_least_3x_lower_than_full_logits():
    # one row of 2,048 tokens, vocabulary 32,000: a (1, 2047, 32000) float32 tensor is 262 MB
    full, chunked = peak_bytes("full"), peak_bytes("chunked")
    for mode in ("train", "score"):
        assert full[mode] > 2 * 262e6  # the reference path does hold several full-vocabulary tensors at once
        assert full[mode] >= 3 * chunked[mode], (mode, full[mode] / 1e6, chunked[mode] / 1e6)


def test_scoring_only_some_positions_equals_the_full_scores_there(tiny_llm):
    import copy

    model = copy.deepcopy(tiny_llm.model).double().train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (3, 13), generator=g)
    attention = torch.ones_like(ids)
    positions = torch.rand(3, 12, generator=g) < 0.5
    weights = torch.randn(3, 12, generator=g, dtype=torch.float64)

    def run(**kw):
        model.zero_grad(set_to_none=True)
        logps, ent = token_logprobs_and_entropy(model, ids, attention, 0.7, **kw)
        (logps * weights * positions).sum().backward()
        return logps.detach(), ent, {k: p.grad.clone() for k, p in model.named_parameters()}

    ref_lp, ref_ent, ref_grad = run()
    lp, ent, grad = run(positions=positions, chunk_elements=4 * model.config.vocab_size)
    assert torch.equal(lp[~positions], torch.zeros_like(lp[~positions]))
    assert torch.allclose(lp[positions], ref_lp[positions], rtol=1e-9, atol=1e-9)
    assert torch.allclose(ent[positions], ref_ent[positions], rtol=1e-9, atol=1e-9)
    for k in ref_grad:
        assert torch.linalg.norm(grad[k] - ref_grad[k]) <= 1e-6 * torch.linalg.norm(ref_grad[k]), k


def test_bfloat16_head_gradient_adds_its_chunks_in_float32():
    """Under FSDP's bfloat16 mixed precision the head's weight is bfloat16 and its gradient is the sum of every
    logit chunk's share (300 chunks here, as a few thousand tokens of a 151k vocabulary): added in bfloat16 the
    error grows with the square root of the chunk count; added in float32 it stays at one bfloat16 rounding."""
    from palaestra.shared.rl.logprobs import head_logprobs

    torch.manual_seed(0)
    positions, hidden_size, vocab = 600, 64, 512
    hidden = torch.randn(positions, hidden_size, dtype=torch.float64).bfloat16()
    weight = (torch.randn(vocab, hidden_size, dtype=torch.float64) * 0.1).bfloat16()
    targets = torch.randint(0, vocab, (positions,))
    coef = torch.randn(positions, dtype=torch.float64)

    def head_gradient(dtype, float32_sum=None):
        head = torch.nn.Linear(hidden_size, vocab, bias=False).to(dtype)
        with torch.no_grad():
            head.weight.copy_(weight.to(dtype))
        h = hidden.to(dtype).requires_grad_(True)
        lp, _ = head_logprobs(
            h, targets, head, with_entropy=False, chunk_elements=2 * vocab, float32_grad_sum=float32_sum
        )
        (lp.double() * coef).sum().backward()
        return lp.detach(), head.weight.grad.double()

    _, exact = head_gradient(torch.float64)  # the same bfloat16 values, every sum in float64
    lp_bf16_sum, bf16_sum = head_gradient(torch.bfloat16, float32_sum=False)  # what autograd does by itself
    lp_default, default = head_gradient(torch.bfloat16)  # the default for a bfloat16 head: float32 sums
    err = {name: float((g - exact).norm() / exact.norm()) for name, g in (("bf16", bf16_sum), ("f32", default))}
    assert torch.equal(lp_default, lp_bf16_sum)  # the forward is the same bfloat16 matmul
    assert err["f32"] < 0.004 < 0.008 < err["bf16"]  # measured: 0.0029 vs 0.0124
