"""The embedded `tiny` model and the project's chat template (checked against toolcall's own format)."""

import json

import torch

from palaestra.shared.llm.tiny import TOKEN_SETS, TOOL_TOKENS, build_tiny, build_tokenizer, extra_tokens, tiny_path
from palaestra.shared.toolcall import ToolCall, format_calls, parse_response

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_tiny_is_a_small_qwen3_and_deterministic_per_seed():
    model_a, tok_a = build_tiny(seed=0)
    tok_b = build_tokenizer()
    model_b, _ = build_tiny(seed=0, tokenizer=tok_b)
    model_c, _ = build_tiny(seed=1, tokenizer=tok_b)
    assert type(model_a).__name__ == "Qwen3ForCausalLM"
    n_params = sum(p.numel() for p in model_a.parameters())
    assert 1_000_000 < n_params < 3_000_000
    assert tok_a.get_vocab() == tok_b.get_vocab()
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(a, c) for a, c in zip(model_a.parameters(), model_c.parameters()))


def test_tokenizer_roundtrips_text_and_keeps_tool_tokens_whole():
    tok = build_tokenizer()
    text = 'Héllo wörld 12345 {"name": "get_weather", "arguments": {"city": "Paris"}} ✓'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    for token in [*TOOL_TOKENS, *extra_tokens(), "<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == token
    # decoding for users keeps <think>/<tool_call> (they are not "special") but drops <|im_end|>
    ids = tok.encode("<think>x</think><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think>"
    assert tok.encode("2026", add_special_tokens=False).__len__() == 4  # digits one by one


def test_registered_token_sets_become_single_tokens_and_key_the_cache(tmp_path, monkeypatch):
    """The core knows no package's tokens: a package registers a token set (here the test) and gets one token each."""
    monkeypatch.setenv("PALAESTRA_CACHE", str(tmp_path))
    before = tiny_path(0)
    word = "<ZQ-TEST-MOVE>"
    assert len(build_tokenizer().encode(word, add_special_tokens=False)) > 1
    TOKEN_SETS.register("zz_test_tokens", lambda: [word])
    try:
        assert word in extra_tokens()
        tok = build_tokenizer()
        assert len(tok.encode(word, add_special_tokens=False)) == 1
        assert tiny_path(0) != before  # another tokenizer, another cache entry
    finally:
        TOKEN_SETS.unregister("zz_test_tokens")


def test_template_renders_assistant_turns_exactly_as_format_calls():
    tok = build_tokenizer()
    calls = [ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Oslo"})]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": "<think>two cities</think>", "tool_calls": [c.to_openai("c1") for c in calls]},
        {"role": "tool", "content": json.dumps({"temp": 21})},
        {"role": "tool", "content": json.dumps({"temp": 9})},
        {"role": "assistant", "content": "21 and 9."},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    expected_turn = format_calls(calls, thinking="two cities")
    assert f"<|im_start|>assistant\n{expected_turn}<|im_end|>\n" in text
    assert parse_response(expected_turn).calls == calls
    # consecutive tool results share one user turn
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>\n{"temp": 9}\n' in text
    assert text.endswith("<|im_start|>assistant\n21 and 9.<|im_end|>\n")
    prompt = tok.apply_chat_template(messages[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("Weather in Paris and Oslo?<|im_end|>\n<|im_start|>assistant\n")


def test_template_accepts_reasoning_content_and_string_arguments():
    tok = build_tokenizer()
    call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "reasoning_content": "hm", "tool_calls": [call]},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert format_calls([ToolCall("f", {"x": 1})], thinking="hm") + "<|im_end|>" in text
    assert "# Tools" not in text and "system" not in text


def test_assistant_mask_covers_exactly_the_assistant_turns():
    tok = build_tokenizer()
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>easy</think>4"},
    ]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask)
    assistant = tok.decode([i for i, m in zip(ids, mask) if m])
    assert assistant == "hello<|im_end|><think>easy</think>\n4<|im_end|>"
