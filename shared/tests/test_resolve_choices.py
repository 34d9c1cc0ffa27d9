"""Every fixed choice of the RL config is refused at resolve time: ``palaestra run --dry-run`` exits 2 with one line
naming the key (and the nearest choice), before any model loads. Each case passed ``--dry-run`` before."""

import pytest

from palaestra.shared import cli
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config

RL = {"job": "rl.train", "envs": [{"name": "task", "kwargs": {"source": "next_number", "reward": "exact_answer"}}]}


def dry_run(tmp_path, capsys, override: str) -> tuple[int, str]:
    import yaml

    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(RL))
    code = cli.main(["run", str(path), "--dry-run", override])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("learner.strategy=fdsp", "invalid value for 'learner.strategy': Invalid value 'fdsp'"),
        ("learner.compute_dtype=bf16", "invalid value for 'learner.compute_dtype'"),
        ("loss.dual_clip=0.5", "invalid value for 'loss.dual_clip': the dual-clip constant must be > 1"),
        ("loss.dual_clip=1.0", "must be > 1"),
        ("llm.backend=openai", "invalid value for 'llm': backend 'openai': the learner trains a local model"),
        ("llm.dtype=bfloat16", "invalid value for 'llm': dtype 'bfloat16': the learner keeps float32"),
        ("steps=-3", "invalid value for 'steps': must be >= 0, got -3"),
        ("envs.0.kwargs.source_kwargs.num_sample=4", "task source 'next_number' takes no argument 'num_sample'"),
        ("torch_threads=-1", "invalid value for 'torch_threads': must be >= 0, got -1"),
    ],
)
def test_choice_is_a_one_line_dry_run_error(tmp_path, capsys, override, message):
    code, err = dry_run(tmp_path, capsys, override)
    assert code == 2
    assert err.startswith("palaestra: error: ") and "\n" not in err
    assert message in err


@pytest.mark.parametrize(
    ("override", "nearest"),
    [
        ("learner.strategy=fdsp", "fsdp"),
        ("learner.compute_dtype=bf16", "bfloat16"),
        ("envs.0.kwargs.source_kwargs.num_sample=4", "num_samples"),
    ],
)
def test_choice_error_names_the_nearest(tmp_path, capsys, override, nearest):
    _, err = dry_run(tmp_path, capsys, override)
    assert f"did you mean '{nearest}'?" in err


def test_valid_choices_still_resolve():
    cfg = load_config(
        RL,
        [
            "learner.strategy=ddp",
            "learner.compute_dtype=bfloat16",
            "loss.dual_clip=1.4",
            "steps=0",
            "envs.0.kwargs.source_kwargs.num_samples=4",
            "workers.llm={backend: openai, model: served}",  # rollouts may use another backend
        ],
    )
    assert cfg.learner.strategy == "ddp" and cfg.learner.compute_dtype == "bfloat16" and cfg.loss.dual_clip == 1.4


def test_task_source_kwargs_checked_against_the_default_source():
    """No ``source`` given: the kwargs are checked against the env's default source (next_number)."""
    with pytest.raises(ConfigError, match="task source 'next_number' takes no argument 'bogus'"):
        load_config({"job": "rl.train", "envs": [{"name": "task", "kwargs": {"source_kwargs": {"bogus": 1}}}]})


def test_pipeline_only_names_its_stages(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("job: pipeline\nstages:\n  train: {job: rl.train}\n")
    assert cli.main(["run", str(path), "--dry-run", "only=[trian]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "palaestra: error: invalid value for 'only': unknown stage(s) ['trian']; stages: ['train']"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "advantages=[{name: grpo, options: {scale: grop}}]",
            "invalid value for 'advantages.0.options.scale': 'grop' is not one of group, batch, none; "
            "did you mean 'group'?",
        ),
        (
            "advantages=[{name: grpo}, {name: entropy_clipped, options: {span: thnik}}]",
            "'advantages.1.options.span': 'thnik' is not one of think, response; did you mean 'think'?",
        ),
        (
            "advantages=[{name: grpo}, {name: entropy_clipped, options: {lam: high}}]",
            "invalid value for 'advantages.1.options.lam': expected float, got 'high'",
        ),
        (
            "advantages=[{name: grpo}, {name: entropy_clipped, options: {lam: 3.0, alpha: 2.0}}]",
            "advantage estimator 'entropy_clipped': lam (3.0) >= alpha (2.0) could flip the advantage's sign",
        ),
        (
            "advantages=[{name: grpo, options: {sacle: batch}}]",
            "unknown key 'advantages.0.options.sacle': advantage estimator 'grpo' takes no argument 'sacle'; "
            "did you mean 'scale'?",
        ),
        (
            "advantages=[{name: entropy_clipped}]",
            "invalid value for 'advantages': 'entropy_clipped' transforms advantages and has nothing before it; "
            "put e.g. grpo first",
        ),
        ("advantages=[{name: agent_norm}]", "'agent_norm' transforms advantages and has nothing before it"),
        (
            "advantages=[{name: turn_level}, {name: grpo}]",
            "'grpo' (advantages[1]) makes values from rewards, so it must come first",
        ),
        ("advantages=[]", "the advantage pipeline is empty"),
    ],
)
def test_advantage_options_and_order_are_one_line_dry_run_errors(tmp_path, capsys, override, message):
    code, err = dry_run(tmp_path, capsys, override)
    assert code == 2
    assert err.startswith("palaestra: error: ") and "\n" not in err
    assert message in err


def test_valid_advantage_pipelines_still_resolve():
    """Negative control of the refusals above: the same estimators with valid options and order resolve."""
    cfg = load_config(
        RL,
        [
            "advantages=[{name: grpo, options: {scale: batch}}, "
            "{name: entropy_clipped, options: {lam: 0.4, alpha: 2, span: response}}]"
        ],
    )
    assert [(a.name, a.options) for a in cfg.advantages] == [
        ("grpo", {"scale": "batch"}),
        ("entropy_clipped", {"lam": 0.4, "alpha": 2, "span": "response"}),
    ]
    mars = load_config(RL, ["advantages=[{name: turn_level, options: {gamma: 0.9}}, {name: agent_norm}]"])
    assert [a.name for a in mars.advantages] == ["turn_level", "agent_norm"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (  # raw log-probs are the untempered model's: a tempered or truncated rollout did not sample from it
            ["rollout.temperature=0.7"],
            "llm.logprobs_mode=raw logs the untempered model, but the rollout samples at temperature 0.7",
        ),
        (["rollout.top_k=20"], "top_k 20, top_p 1.0: set llm.logprobs_mode=processed"),
        (["rollout.top_p=0.9"], "top_p 0.9: set llm.logprobs_mode=processed"),
        (["loss.logprob_temperature=0.5"], "untempered: set loss.logprob_temperature=1.0 (got 0.5)"),
        (  # processed: the learner must score at the rollout's temperature
            ["llm.logprobs_mode=processed", "rollout.temperature=0.7", "loss.logprob_temperature=1.0"],
            "llm.logprobs_mode=processed logs them at rollout.temperature=0.7, but the learner scores at "
            "loss.logprob_temperature=1.0",
        ),
        (  # the workers' client is the one that logs them
            ["workers.num_workers=1", "workers.llm={model: tiny, dtype: float32}", "llm.logprobs_mode=processed"]
            + ["rollout.temperature=0.7"],
            "workers.llm.logprobs_mode=raw logs the untempered model",
        ),
    ],
)
def test_behaviour_correction_refuses_a_mismatched_scoring(tmp_path, capsys, overrides, message):
    import yaml

    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(RL))
    code = cli.main(["run", str(path), "--dry-run", "loss.behaviour_correction=tis", *overrides])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("palaestra: error: ") and "\n" not in err
    assert message in err


@pytest.mark.parametrize(
    "overrides",
    [
        ["llm.logprobs_mode=processed", "rollout.temperature=0.7", "rollout.top_k=20", "rollout.top_p=0.9"],
        ["llm.logprobs_mode=processed", "rollout.temperature=0.7", "loss.logprob_temperature=0.7"],
        ["loss.logprob_temperature=1.0"],  # raw at temperature 1, untruncated
        # workers: their llm, not the learner's, logs the behaviour log-probs
        ["workers.num_workers=1", "workers.llm={model: tiny, dtype: float32, logprobs_mode: processed}"]
        + ["rollout.temperature=0.7"],
        ["workers.llm={model: tiny, logprobs_mode: processed}", "llm.logprobs_mode=processed"]  # no workers: llm's
        + ["rollout.temperature=0.7"],
    ],
)
def test_behaviour_correction_accepts_the_matching_scoring(overrides):
    cfg = load_config(RL, ["loss.behaviour_correction=tis", *overrides])
    assert cfg.loss.behaviour_correction == "tis"
