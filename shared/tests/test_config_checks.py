"""Checks at resolve time: registry names with did-you-mean, enum choices, entry keyword arguments, outputs confined
to output_dir, circular ``base:``; and the CLI around them (options anywhere, one-line errors, ``show``)."""

import inspect
import re
import subprocess
import sys

import numpy as np
import pytest

from palaestra.shared import cli
from palaestra.shared.config import ConfigError, read_yaml
from palaestra.shared.config_checks import confined_path
from palaestra.shared.jobs import load_config
from palaestra.shared.llm.generate import LLMGenerateConfig
from palaestra.shared.rl.advantages import ADVANTAGES
from palaestra.shared.rl.loss import LossConfig, Reduction

RL = {"job": "rl.train", "envs": [{"name": "task", "kwargs": {"source": "next_number", "reward": "exact_answer"}}]}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("advantages.0.name=grp", "invalid value for 'advantages.0.name': unknown advantage estimator 'grp'; did you"),
        ("envs.0.name=tsk", "unknown environment 'tsk'; did you mean 'task'"),
        ("envs.0.kwargs.source=nxt_number", "unknown task source 'nxt_number'; did you mean 'next_number'"),
        ("envs.0.kwargs.reward=exact_anser", "unknown reward 'exact_anser'; did you mean 'exact_answer'"),
        ("envs.0.kwargs.reward={exact_anser: 1.0}", "unknown reward 'exact_anser'"),
        ("envs.0.kwargs.sorce=next_number", "'task' takes no argument 'sorce'; did you mean 'source'"),
        ("sft_warmup.source=nxt_number", "invalid value for 'sft_warmup.source': unknown task source"),
        ("llm.backend=transformer", "unknown LLM backend 'transformer'; did you mean 'transformers'"),
        ("llm.model=tinny", "invalid value for 'llm.model'"),
        ("loss.reduction=dapoo", f"expected one of [{', '.join(m.name for m in Reduction)}]; did you mean 'dapo'"),
        ("llm.dtype=bfloat61", "did you mean 'bfloat16'"),
        ("advantages=[{name: entropy_clipped, options: {lamb: 0.4}}]", "takes no argument 'lamb'; did you mean 'lam'"),
    ],
)
def test_misspelled_names_fail_at_resolve(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(RL, [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_correct_names_and_choices_resolve():
    cfg = load_config(
        RL,
        [
            "loss.reduction=dr_grpo",
            "loss.max_len=8",
            "advantages=[{name: grpo}, {name: entropy_clipped, options: {lam: 0.4, alpha: 2.0}}]",
            "envs.0.kwargs.reward={exact_answer: 1.0}",
            "llm.model=outputs/not/yet/written",  # a path an earlier stage may write: not checked
            "llm.dtype=float32",
        ],
    )
    assert cfg.loss.reduction is Reduction.dr_grpo and cfg.loss.reduction == "dr_grpo"
    assert [a.name for a in cfg.advantages] == ["grpo", "entropy_clipped"]
    assert cfg.llm.dtype == "float32"


def test_enum_field_lists_every_reduction_the_loss_accepts():
    """Each member has its own normalizer: rows 2 (grpo), rows with a token 1, tokens 3, rows x max_len 10."""
    import torch

    from palaestra.shared.rl.loss import loss_normalizer

    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    got = {m.value: loss_normalizer(mask, LossConfig(reduction=m, max_len=5)) for m in Reduction}
    assert got == {"grpo": 2.0, "seq-mean-token-sum": 1.0, "dapo": 3.0, "dr_grpo": 10.0}
    assert LossConfig().reduction == "grpo"
    # one spelling: each member's name is its value, so the config's error lists what a config writes
    assert [m.name for m in Reduction] == [m.value for m in Reduction]


def test_a_name_registered_at_run_time_is_accepted():
    ADVANTAGES.register("test_late_estimator", lambda values, batch: values)
    try:
        assert load_config(RL, ["advantages.0.name=test_late_estimator"]).advantages[0].name == "test_late_estimator"
    finally:
        ADVANTAGES.unregister("test_late_estimator")


@pytest.mark.parametrize("output", ["../../x.jsonl", "/tmp/x.jsonl", "a/../../b.jsonl"])
def test_generate_output_cannot_leave_output_dir(tmp_path, output):
    with pytest.raises(ConfigError, match=r"'output' \(.*\) leaves output_dir"):
        load_config({"job": "llm.generate", "output_dir": str(tmp_path / "out")}, [f"output={output}"])


def test_confined_path(tmp_path):
    out = tmp_path / "out"
    assert confined_path(out, "run", "a.jsonl") == out / "run" / "a.jsonl"
    assert confined_path(out, "run", "sub/../a.jsonl").resolve() == (out / "run" / "a.jsonl").resolve()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path)  # a symlink inside that points outside
    with pytest.raises(ConfigError, match="leaves output_dir"):
        confined_path(out, "link", "x.jsonl")
    with pytest.raises(ConfigError, match="leaves output_dir"):
        confined_path(out, "..", "x.jsonl")


def test_generate_job_refuses_escaping_run_name(tmp_path):
    from palaestra.shared.llm.generate import generate
    from palaestra.shared.tracking import Tracker

    cfg = LLMGenerateConfig(job="llm.generate", output_dir=str(tmp_path / "out"), prompts=["hi"])
    cfg.tracking.enabled = False
    cfg.tracking.run_name = "../.."
    victim = tmp_path / "completions.jsonl"
    victim.write_text("keep me\n")
    with pytest.raises(ConfigError, match="leaves output_dir"):
        generate(cfg, Tracker(cfg.tracking))
    assert victim.read_text() == "keep me\n"


def test_circular_base_names_the_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\njob: llm.generate\n")
    (tmp_path / "b.yaml").write_text("base: [c.yaml]\n")
    (tmp_path / "c.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError) as err:
        read_yaml(tmp_path / "a.yaml")
    message = str(err.value)
    assert message.startswith("circular 'base:'") and "\n" not in message
    assert re.search(r"a\.yaml -> .*b\.yaml -> .*c\.yaml -> .*a\.yaml$", message)
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    with pytest.raises(ConfigError, match=r"self\.yaml -> .*self\.yaml"):
        read_yaml(tmp_path / "self.yaml")


def test_a_diamond_of_bases_is_not_a_cycle(tmp_path):
    (tmp_path / "common.yaml").write_text("seed: 5\n")
    (tmp_path / "x.yaml").write_text("base: common.yaml\n")
    (tmp_path / "y.yaml").write_text("base: common.yaml\n")
    (tmp_path / "top.yaml").write_text("base: [x.yaml, y.yaml]\njob: llm.generate\n")
    assert read_yaml(tmp_path / "top.yaml") == {"seed": 5, "job": "llm.generate"}


def _palaestra(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "palaestra.shared.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_options_anywhere_and_one_line_errors(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("job: llm.generate\n")
    out = _palaestra("run", str(cfg), "--dry-run", "seed=3", "output=x.jsonl")
    assert out.returncode == 0, out.stderr
    assert "seed: 3" in out.stdout and "output: x.jsonl" in out.stdout
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    for args in (["run", str(cfg), "--dry-run", "output=../x"], ["run", str(tmp_path / "loop.yaml"), "--dry-run"]):
        out = _palaestra(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = _palaestra("run", str(cfg), "--bogus", "seed=1")
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr


def _docstrings_in_source(cls) -> dict[str, str]:
    """Field docstrings read a second way: regex over the source text (the CLI reads them with ast)."""
    src = inspect.getsource(cls)
    return {m[0]: " ".join(m[1].split()) for m in re.findall(r"\n    (\w+): [^\n]*\n    \"\"\"(.*?)\"\"\"", src, re.S)}


def test_show_prints_every_field_with_type_default_and_docstring():
    out = _palaestra("show", "rl.train")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"loss.reduction: Reduction {{{', '.join(m.name for m in Reduction)}}} = grpo" in text
    assert "\nsteps: int = 10\n    RL steps (one rollout + its updates each).\n" in text
    assert "envs[].name: str = task" in text
    from palaestra.shared.rl.loss import LossConfig as Loss

    for name, doc in _docstrings_in_source(Loss).items():
        assert f"loss.{name}: " in text and f"    {doc}\n" in text, name
    # every leaf of the resolved default config is listed
    from palaestra.shared.config import flatten

    cfg = load_config({"job": "rl.train"})
    listed = set(re.findall(r"^([\w.\[\]]+): ", text, re.M))
    missing = [k for k in flatten(cfg) if k not in listed and not k.startswith(("envs.", "advantages."))]
    assert not missing


def test_show_unknown_job_is_one_line():
    out = _palaestra("show", "rl.trian")
    assert out.returncode == 2 and "did you mean 'rl.train'" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_non_finite_loss_through_the_cli_is_one_line(tmp_path, capsys):
    @ADVANTAGES.register("test_cli_nan")
    def nan(values, batch):
        return [np.full(len(r), np.nan) for r in batch.turn_rewards]

    cfg = tmp_path / "nan.yaml"
    cfg.write_text(
        "job: rl.train\nadvantages: [{name: test_cli_nan}]\nsteps: 1\ntasks_per_step: 2\ntorch_threads: 1\n"
        f"output_dir: {tmp_path / 'out'}\ntracking: {{enabled: false}}\n"
        "rollout: {group_size: 2, max_tokens_per_turn: 4}\n"
    )
    try:
        code = cli.main(["run", str(cfg)])
    finally:
        ADVANTAGES.unregister("test_cli_nan")
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("palaestra:")]
    assert len(lines) == 1 and "non-finite loss" in lines[0], err
    assert "Traceback" not in err
