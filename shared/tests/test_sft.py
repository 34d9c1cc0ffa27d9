"""SFT: assistant-only loss mask from the rollouts' chat template, learning, the rl.sft job."""

import json

import pytest
import torch

import palaestra.shared.rl.sft as sft  # (registers rl.sft)
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.llm import LLMConfig, make_client
from palaestra.shared.rl.sft import SFTOptions, load_samples, run_sft, sft_loss, tokenize

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
CONVERSATION = {
    "tools": TOOLS,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": "<think>use the tool</think>",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
    ],
}


def segments(ids, mask):
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def test_mask_covers_exactly_the_assistant_turns(tiny_llm):
    tok = tiny_llm.tokenizer
    ids, mask = tokenize(tok, CONVERSATION, 4096)
    # the prompt up to the first assistant turn, rendered on its own, carries no loss
    prefix = tiny_llm.render(CONVERSATION["messages"][:2], TOOLS, add_generation_prompt=True)
    assert ids[: len(prefix)] == prefix and not any(mask[: len(prefix)])
    parts = [tok.decode(s) for s in segments(ids, mask)]
    assert parts == [
        "<think>use the tool</think>\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>',
        "It is 5.<|im_end|>",
    ]
    assert "<tool_response>" not in "".join(parts) and "add 2 and 3" not in "".join(parts)


def test_loss_is_cross_entropy_on_assistant_tokens_only(tiny_llm):
    tok = tiny_llm.tokenizer
    ids, mask = tokenize(tok, CONVERSATION, 4096)
    with torch.no_grad():
        loss = sft_loss(tiny_llm.model, [(ids, mask)], tok.pad_token_id)
        logits = tiny_llm.model(input_ids=torch.tensor([ids])).logits[0, :-1]
        logp = torch.log_softmax(logits.float(), -1)
        picked = [-logp[j, ids[j + 1]] for j in range(len(ids) - 1) if mask[j + 1]]
    assert loss.item() == pytest.approx(torch.stack(picked).mean().item(), rel=1e-5)


def test_sft_learns_and_job_saves_a_loadable_model(tmp_path, tracking):
    data = tmp_path / "data.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}]}
        for w in ["red", "blue", "green", "house"]
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = load_config(
        {
            "job": "rl.sft",
            "tracking": vars(tracking),
            "output_dir": str(tmp_path / "out"),
            "llm": {"model": "tiny", "device": "cpu"},
            "sft": {"steps": 30, "data_path": str(data), "batch_size": 4, "lr": 3e-3},
        }
    )
    out = run_job(cfg)
    assert out["loss_last"] < 0.5 * out["loss_first"]
    trained = make_client(LLMConfig(model=out["model_dir"], device="cpu"))
    from palaestra.shared.llm import SamplingParams

    greedy = trained.chat([[{"role": "user", "content": "say blue"}]], SamplingParams(temperature=0, max_tokens=5))
    assert greedy[0].text.strip() == "blue"


def test_bad_data_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(ConfigError, match="no assistant message"):
        load_samples(SFTOptions(data_path=str(bad)))
    bad.write_text("{not json\n")
    with pytest.raises(ConfigError, match=":1: not valid JSON"):
        load_samples(SFTOptions(data_path=str(bad)))
    with pytest.raises(ConfigError, match="not found"):
        load_samples(SFTOptions(data_path=str(tmp_path / "missing.jsonl")))


def test_max_length_that_cuts_every_assistant_token_is_a_clear_error(tiny_llm):
    tok = tiny_llm.tokenizer
    ids, mask = tokenize(tok, CONVERSATION, 4096)
    first = mask.index(1)
    assert any(tokenize(tok, CONVERSATION, first + 1)[1])  # one assistant token left: trainable
    with pytest.raises(ConfigError, match=f"max_length {first} cuts every assistant token"):
        tokenize(tok, CONVERSATION, first)


def test_warm_start_cache_loads_the_weights_training_gives(tmp_path, monkeypatch):
    """A cached warm start equals training it afresh bit for bit (weights, metrics, the torch RNG after it);
    other options miss the cache."""
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(CONVERSATION | {"tools": TOOLS}) for _ in range(3)))
    opts = SFTOptions(steps=4, data_path=str(data), batch_size=2, lr=3e-3)

    def trained(o: SFTOptions):
        client = make_client(LLMConfig(model="tiny", device="cpu"))
        torch.manual_seed(7)
        metrics = run_sft(client.model, client.tokenizer, o)
        return client.model.state_dict(), metrics, torch.rand(3)

    fresh = trained(opts)  # no cache
    cached = SFTOptions(**{**vars(opts), "cache_dir": str(tmp_path / "cache")})
    first = trained(cached)
    monkeypatch.setattr(sft, "_train", lambda *a: pytest.fail("a cached warm start trained again"))
    second = trained(cached)
    monkeypatch.undo()
    assert len(list((tmp_path / "cache").iterdir())) == 1  # one key, stored once
    for got in (first, second):
        assert got[1] == fresh[1] and torch.equal(got[2], fresh[2])
        assert all(torch.equal(got[0][k], v) for k, v in fresh[0].items())
    trained(SFTOptions(**{**vars(cached), "lr": 1e-3}))
    assert len(list((tmp_path / "cache").iterdir())) == 2
