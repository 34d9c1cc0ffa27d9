"""The rehearsal core (palaestra.shared.rehearse): the Qwen3-style template, the scaling table, the model it builds.

The expected renderings are written out by hand from Qwen3's documented behaviour (an assistant turn before the
last user query loses its ``<think>`` block; the one after it keeps it as ``<think>\\n..\\n</think>\\n\\n``; tool
calls follow the answer in ``<tool_call>`` tags; tools go in the system turn), not produced by the template.
The four paper configs' rehearsals are run in tests/test_rehearse.py.
"""

from __future__ import annotations

import json

import pytest

from palaestra.shared.cli import parse_args
from palaestra.shared.config import ConfigError
from palaestra.shared.rehearse import (
    QWEN3_STYLE_TEMPLATE,
    _rehearsal,
    compare,
    flatten,
    format_table,
    rehearsal_model,
    set_dotted,
)

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def render(messages, tools=None, add_generation_prompt=False) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = env.from_string(QWEN3_STYLE_TEMPLATE.read_text())
    return template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def test_earlier_turns_lose_their_think_block_the_last_keeps_it():
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>\nfirst thought\n</think>\n\nanswer one"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "<think>second</think>answer two"},
    ]
    expected = (
        "<|im_start|>user\na<|im_end|>\n"
        "<|im_start|>assistant\nanswer one<|im_end|>\n"
        "<|im_start|>user\nb<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nsecond\n</think>\n\nanswer two<|im_end|>\n"
    )
    assert render(messages) == expected
    # so the conversation is not prefix-stable: the first two turns rendered alone keep the first thought
    alone = render(messages[:2])
    assert alone == (
        "<|im_start|>user\na<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nfirst thought\n</think>\n\nanswer one<|im_end|>\n"
    )
    assert not render(messages).startswith(alone)


def test_tools_calls_and_responses():
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
    ]
    text = render(messages, tools=[TOOL], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n\n")
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in text
    assert text.endswith(
        "<|im_start|>user\nq<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_rehearsal_model_is_qwen3_with_the_qwen3_style_template(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    path = rehearsal_model(tmp_path)
    assert AutoConfig.from_pretrained(path).model_type == "qwen3"
    tokenizer = AutoTokenizer.from_pretrained(path)
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>t</think>x"},
        {"role": "user", "content": "b"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == render(messages, add_generation_prompt=True) and "<think>" not in text


def test_flatten_set_and_compare():
    paper = {"a": {"b": 1, "c": [1, 2]}, "envs": [{"name": "x", "kwargs": {"n": 5}}]}
    assert flatten(paper) == {"a.b": 1, "a.c": [1, 2], "envs.0.name": "x", "envs.0.kwargs.n": 5}
    scaled = json.loads(json.dumps(paper))
    set_dotted(scaled, "envs.0.kwargs.n", 1)
    set_dotted(scaled, "d.e", "new")
    table, changed = compare(paper, scaled)
    assert changed == ["envs.0.kwargs.n", "d.e"]
    assert ("envs.0.kwargs.n", "5", "1") in table and ("d.e", "(default)", "new") in table
    lines = format_table(table, changed).splitlines()
    assert lines[1].startswith("envs.0.kwargs.n") and lines[1].endswith("scaled")
    assert lines[-1].endswith("kept")


def test_a_job_without_a_rehearsal_is_a_one_line_error():
    with pytest.raises(ConfigError, match="job 'llm.generate' has no rehearsal"):
        _rehearsal("llm.generate")


def test_cli_takes_rehearse():
    args = parse_args(["rehearse", "x.yaml", "--workdir", "w", "steps=1"])
    assert (args.config, args.workdir, args.overrides) == ("x.yaml", "w", ["steps=1"])
