"""The quickstart's stages find each other's files under whatever ``output_dir`` the pipeline is given.

Stages refer to the pipeline's output directory through ``${output_dir}``; a
literal ``outputs/quickstart/...`` path would break ``output_dir=DIR``.
"""

import json
from pathlib import Path

import pytest

from palaestra.shared.config import to_dict
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.pipeline import stage_configs

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"


def _strings(tree):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _strings(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _strings(value)
    elif isinstance(tree, str):
        yield tree


def test_every_stage_follows_an_overridden_output_dir(tmp_path):
    out = tmp_path / "qs"
    stages = stage_configs(load_config(QUICKSTART, [f"output_dir={out}"]))
    for name, stage in stages.items():
        assert Path(stage.output_dir).is_relative_to(out), f"stage {name} writes to {stage.output_dir}"
        leftovers = [s for s in _strings(to_dict(stage)) if "outputs/" in s]  # e.g. outputs/quickstart/...
        assert not leftovers, f"stage {name} names a fixed output directory: {leftovers}"
    # the files a stage reads are the ones the stage before it writes, by each job's own path rules
    datagen_file = stages["datagen"].output_path  # datagen's rule: <output_dir>/datagen/<name>/samples.jsonl
    assert datagen_file == out / "datagen" / "quickstart" / "samples.jsonl"
    (egpo_env,) = stages["egpo"].envs
    assert Path(egpo_env.kwargs["source_kwargs"]["path"]) == datagen_file
    selfplay = stages["mars_selfplay"]
    checkpoint = Path(selfplay.output_dir) / "checkpoints" / f"step_{selfplay.steps:06d}"  # the trainer's layout
    assert Path(stages["mars_eval"].llm.model) == checkpoint
    # the evaluation prompts as the warm start and the self-play did (a `compact` eval of a `minimal`-trained model
    # lost 67% of its games on format)
    assert stages["mars_eval"].prompt == selfplay.prompt == selfplay.sft_warmup.source_kwargs["prompt"]


def test_mars_package_quickstart_equals_the_main_quickstarts_mars_stages(tmp_path):
    """experiments/mars/quickstart.yaml (for a lab with only palaestra-mars installed) resolves to the same mars
    stages as the main quickstart, under the default and an overridden output_dir."""
    mars_quickstart = QUICKSTART.parent / "mars" / "quickstart.yaml"
    for overrides in ([], [f"output_dir={tmp_path}"]):
        main = stage_configs(load_config(QUICKSTART, [*overrides, "only=[mars_selfplay,mars_eval]"]))
        alone = stage_configs(load_config(mars_quickstart, overrides))
        assert list(alone) == ["mars_selfplay", "mars_eval"]
        for name in alone:
            assert to_dict(alone[name]) == to_dict(main[name]), f"stage {name} differs"


@pytest.mark.slow
def test_egpo_stage_reads_what_datagen_wrote_under_another_output_dir(tmp_path, tracking, monkeypatch):
    """Run the datagen stage (shrunk: 4 items on one API, in this process) under output_dir=tmp, then build the
    egpo stage's environment from its resolved config: it must load the samples datagen wrote, each turn a task."""
    from palaestra.shared.rl.episodes import make_env

    monkeypatch.chdir(tmp_path)  # nothing may land under the default outputs/quickstart either
    out = tmp_path / "elsewhere"
    track = f"tracking={json.dumps({'experiment': 'qs', 'uri': tracking.uri, 'artifact_root': tracking.artifact_root})}"
    cfg = load_config(QUICKSTART, [f"output_dir={out}", "only=[datagen]", track])
    cfg.stages["datagen"]["overrides"] = ["num_samples=4", "workers=0", "envs=[MathAPI]"]
    run_job(cfg)
    written = out / "datagen" / "quickstart" / "samples.jsonl"
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert rows, "datagen wrote no samples"
    assert not (tmp_path / "outputs").exists()

    cfg.only = ["egpo"]
    (spec,) = stage_configs(cfg)["egpo"].envs
    env = make_env(spec.name, spec.kwargs)
    assert {task["id"].rsplit("-", 1)[0] for task in env.samples} == {row["id"] for row in rows}  # <record>-<turn>
    first_user = next(m["content"] for m in rows[0]["messages"] if m["role"] == "user")
    assert any(m.get("content") == first_user for m in env.samples[0]["messages"])


def test_mars_warm_start_teaches_responses_that_its_games_accept(tmp_path, tiny_llm):
    """Each assistant turn of the quickstart's mars SFT data, as the chat template renders it (the tokens the model
    learns and then samples), parses under the game's parser as the move it records and ends with the stop string
    within the training rollout's and the evaluation's token limits: a format loss there is the model's, not a
    template, parser or length mismatch of the setup. Where the self-play forces a response prefix (its tokens are
    prompt tokens there, only the rest is sampled), every learned turn starts with exactly that prefix, and the
    evaluation, which forces none, has room for the whole turn."""
    from palaestra.mars.env import parse_answer
    from palaestra.shared.rl.sft import tokenize
    from palaestra.shared.rollout.tasks import TASKS

    stages = stage_configs(load_config(QUICKSTART, [f"output_dir={tmp_path}", "only=[mars_selfplay,mars_eval]"]))
    train, evaluate = stages["mars_selfplay"], stages["mars_eval"]
    assert train.llm.model == "tiny"
    prefix = train.rollout.response_prefix
    assert "</answer>" in train.rollout.stop and "</answer>" in evaluate.stop
    sft = train.sft_warmup
    samples = TASKS.get(sft.source)(**{**sft.source_kwargs, "episodes": 20})
    tokenizer = tiny_llm.tokenizer
    turns = 0
    for sample in samples:
        ids, mask = tokenize(tokenizer, sample, sft.max_length)
        spans, span = [], []  # the assistant turns: runs of masked tokens
        for token, learned in zip(ids, mask, strict=True):
            if learned:
                span.append(token)
            elif span:
                spans.append(span)
                span = []
        spans += [span] if span else []
        recorded = [m["content"] for m in sample["messages"] if m["role"] == "assistant"]
        assert len(spans) == len(recorded)
        for span, content in zip(spans, recorded, strict=True):
            action, error = parse_answer(tokenizer.decode(span), train.shaping.require_think)
            assert error is None and action == parse_answer(content)[0]
            text = tokenizer.decode(span)
            assert text.startswith(prefix), f"{text!r} does not start with the forced prefix {prefix!r}"
            forced = len(tokenizer.encode(prefix, add_special_tokens=False)) if prefix else 0
            assert span[:forced] == tokenizer.encode(prefix, add_special_tokens=False)[:forced]  # same token ids
            length = next(k for k in range(1, len(span) + 1) if "</answer>" in tokenizer.decode(span[:k]))
            assert length - forced <= train.rollout.max_tokens_per_turn and length <= evaluate.max_tokens
            turns += 1
    assert turns >= 20
