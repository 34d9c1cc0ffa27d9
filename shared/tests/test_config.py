"""Config resolution: YAML + base + overrides -> dataclass; errors that name the key."""

from dataclasses import dataclass, field

import pytest

from palaestra.shared.config import ConfigError, JobConfig, flatten, read_yaml, resolve
from palaestra.shared.jobs import job, load_config


@dataclass
class Optim:
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])


@dataclass
class DemoConfig(JobConfig):
    steps: int = 10
    name: str = "demo"
    optim: Optim = field(default_factory=Optim)


@job("test.demo", DemoConfig)
def demo_job(cfg, tracker):
    """A job for the tests."""
    tracker.log_metrics({"x": cfg.steps}, step=0)
    return {"steps": cfg.steps}


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_then_overrides(tmp_path):
    path = write(tmp_path, "c.yaml", "job: test.demo\nsteps: 5\noptim: {lr: 0.1}\n")
    cfg = load_config(path, ["optim.lr=0.5", "name=x"])
    assert isinstance(cfg, DemoConfig)
    assert (cfg.steps, cfg.optim.lr, cfg.name, cfg.optim.betas) == (5, 0.5, "x", [0.9, 0.99])


def test_base_files_compose_relative_to_file(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path, "base.yaml", "job: test.demo\nsteps: 7\nname: base\n")
    path = write(tmp_path / "sub", "c.yaml", "base: ../base.yaml\nname: child\n")
    cfg = load_config(path)
    assert (cfg.steps, cfg.name) == (7, "child")


def test_unknown_key_suggests_nearest(tmp_path):
    path = write(tmp_path, "c.yaml", "job: test.demo\nstpes: 5\n")
    with pytest.raises(ConfigError, match=r"unknown key 'stpes'; did you mean 'steps'\?"):
        load_config(path)


def test_unknown_nested_override_suggests_nearest(tmp_path):
    path = write(tmp_path, "c.yaml", "job: test.demo\n")
    with pytest.raises(ConfigError, match=r"unknown key 'optim.lrr' in 'optim'; did you mean 'optim.lr'\?"):
        load_config(path, ["optim.lrr=1"])


def test_wrong_type_names_the_key(tmp_path):
    path = write(tmp_path, "c.yaml", "job: test.demo\nsteps: many\n")
    with pytest.raises(ConfigError, match="'steps'"):
        load_config(path)


def test_missing_required_value():
    @dataclass
    class Needs(JobConfig):
        model_path: str = "???"

    with pytest.raises(ConfigError, match="missing required value 'model_path'"):
        resolve(Needs, {"job": "x"})


def test_missing_file_and_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        read_yaml(tmp_path / "nope.yaml")
    bad = write(tmp_path, "bad.yaml", "job: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML .* line"):
        read_yaml(bad)
    scalar = write(tmp_path, "scalar.yaml", "just a string\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        read_yaml(scalar)


def test_missing_job_key_and_unknown_job(tmp_path):
    with pytest.raises(ConfigError, match="missing required key 'job'"):
        load_config(write(tmp_path, "a.yaml", "steps: 1\n"))
    from palaestra.shared.registry import UnknownNameError

    with pytest.raises(UnknownNameError, match="did you mean 'test.demo'"):
        load_config(write(tmp_path, "b.yaml", "job: test.dmeo\n"))


def test_bad_override_syntax(tmp_path):
    path = write(tmp_path, "c.yaml", "job: test.demo\n")
    with pytest.raises(ConfigError, match="not of the form key=value"):
        load_config(path, ["steps"])


def test_flatten_dotted_keys():
    flat = flatten(DemoConfig(job="test.demo"))
    assert flat["optim.lr"] == 1e-3
    assert flat["tracking.experiment"] == "palaestra"
    assert "optim" not in flat
