"""Per-turn SFT export through TRL under a chat template that behaves as Qwen3's.

`QWEN3_LIKE` is written here from Qwen3's documented template behaviour: an
assistant message keeps its reasoning (``<think>...</think>``) only after the
last user message, earlier ones lose it; tool results are user turns wrapped
in ``<tool_response>``; a call's ``arguments`` are printed as they are when a
string (OpenAI's form, the export's), dumped when an object; there are no
``{% generation %}`` markers. Under it a
whole multi-turn conversation loses the reasoning of every turn but the last,
and TRL's ``assistant_only_loss`` cannot find the assistant tokens. The
``sft_turns`` export (one row per assistant message, its own history as the
prompt) keeps every reasoning block, and one TRL step with
``completion_only_loss`` trains exactly the completion's tokens: the mask is
checked against an independent tokenization and the step's loss against a
cross-entropy computed here.
"""

from __future__ import annotations

import json
import math

import pytest

from palaestra.datagen.export import openai_record, sft_turn_records

QWEN3_LIKE = """
{%- if tools %}<|im_start|>system
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- set content = m.content or '' %}
{%- set reasoning = '' %}
{%- if '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
<|im_start|>assistant
{% if loop.index0 > ns.last_query and reasoning %}<think>
{{ reasoning.strip() }}
</think>

{% endif %}{{ content }}
{%- for c in m.tool_calls or [] %}
<tool_call>
{%- set args = c.function.arguments if c.function.arguments is string else (c.function.arguments | tojson) %}
{"name": "{{ c.function.name }}", "arguments": {{ args }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from palaestra.shared.llm.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    tok.chat_template = QWEN3_LIKE
    return tok


@pytest.fixture(scope="module")
def rows(deterministic_run):
    path, _ = deterministic_run
    return [json.loads(line) for line in path.read_text().splitlines()]


def _thinks(rows) -> int:
    return sum("<think>" in (m["content"] or "") for r in rows for m in r["messages"] if m["role"] == "assistant")


def test_every_reasoning_block_survives_per_turn_but_not_whole(tokenizer, rows):
    total = _thinks(rows)
    whole = sum(
        tokenizer.apply_chat_template(rec["messages"], tools=rec["tools"], tokenize=False).count("<think>")
        for rec in map(openai_record, rows)
    )
    per_turn = 0
    for row in rows:
        for rec in sft_turn_records(row):
            assert [m["role"] for m in rec["completion"]] == ["assistant"]
            prompt = tokenizer.apply_chat_template(rec["prompt"], tools=rec["tools"], tokenize=False)
            full = tokenizer.apply_chat_template(rec["prompt"] + rec["completion"], tools=rec["tools"], tokenize=False)
            assert full.startswith(prompt)  # prefix-stable: the completion is what follows its prompt
            per_turn += full[len(prompt) :].count("<think>")
    multi = [r for r in rows if sum(m["role"] == "user" for m in r["messages"]) > 1]
    assert multi and whole < total  # a whole conversation loses earlier turns' reasoning
    assert per_turn == total  # each assistant message is one completion, its reasoning kept


@pytest.mark.slow  # about 35 s on one core (TRL's import and trainer set-up)
def test_one_trl_step_trains_exactly_the_completion(tokenizer, rows, tmp_path):
    torch = pytest.importorskip("torch")
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM

    from palaestra.shared.llm.models import resolve_model_path

    torch.set_num_threads(1)
    torch.manual_seed(0)
    row = next(r for r in rows if sum(m["role"] == "user" for m in r["messages"]) > 1)
    recs = sft_turn_records(row)
    rec = next(r for r in recs if r["turn"] > 1)  # a later turn: its history holds an earlier turn
    for r in recs:
        r["tools"] = json.dumps(r["tools"])
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny"), dtype=torch.float32)
    ds = datasets.Dataset.from_list(
        [{"prompt": rec["prompt"], "completion": rec["completion"], "tools": json.loads(rec["tools"])}]
    )
    tools = ds[0]["tools"]  # as arrow returns them (one struct schema: absent fields come back as None)

    # the reference: the template rendered and tokenized here, loss on the tokens after the prompt
    prompt_ids = list(
        tokenizer.apply_chat_template(rec["prompt"], tools=tools, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
    )
    full_ids = list(
        tokenizer.apply_chat_template(rec["prompt"] + rec["completion"], tools=tools, return_dict=True)["input_ids"]
    )
    assert full_ids[: len(prompt_ids)] == prompt_ids
    with torch.no_grad():
        logits = model(torch.tensor([full_ids])).logits[0, :-1]
    targets = torch.tensor(full_ids[1:])
    mask = torch.zeros(len(full_ids) - 1, dtype=torch.bool)
    mask[len(prompt_ids) - 1 :] = True
    reference = torch.nn.functional.cross_entropy(logits[mask], targets[mask]).item()

    cfg = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=1,
        learning_rate=1e-3,
        completion_only_loss=True,
        max_length=None,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        dataloader_num_workers=0,
    )
    trainer = trl.SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tokenizer)
    processed = trainer.train_dataset[0]
    assert processed["input_ids"] == full_ids
    assert processed["labels"] == [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]  # loss on the completion
    out = trainer.train()
    assert math.isfinite(out.training_loss)
    assert abs(out.training_loss - reference) < 1e-3 * max(1.0, reference), (out.training_loss, reference)


def test_assistant_only_loss_needs_generation_markers(tokenizer, rows, tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM

    from palaestra.shared.llm.models import resolve_model_path

    rec = openai_record(rows[0])
    ds = datasets.Dataset.from_list([{"messages": rec["messages"]}])
    cfg = trl.SFTConfig(
        output_dir=str(tmp_path), max_steps=1, assistant_only_loss=True, report_to="none", use_cpu=True, bf16=False
    )
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny"))
    with pytest.raises(Exception, match="generation"):  # why the export trains per turn on completions instead
        trl.SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tokenizer)
