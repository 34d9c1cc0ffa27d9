"""Bad input at the edges, as an attacker or a hurried user gives it: each is one line on stderr and exit status 2,
never a traceback or minutes of work (a non-UTF-8 file, a recursive anchor, a "billion laughs" file, a missing
extra in the trainer's process or in a Ray worker, a crafted ``trainer_state.pt``)."""

import pickle
import sys
import time
from pathlib import Path

import pytest
import yaml

from palaestra.shared import cli, config

RL = {
    "job": "rl.train",
    "envs": [{"name": "task", "kwargs": {"source": "next_number", "reward": "exact_answer"}}],
    "steps": 1,
    "tasks_per_step": 1,
    "rollout": {"group_size": 2, "max_tokens_per_turn": 2},
    "sft_warmup": {"steps": 0},
    "eval_tasks": 0,
    "log_samples": 0,
    "tracking": {"enabled": False},
    "llm": {"model": "tiny", "device": "cpu"},
}


def run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["run", *argv])
    err = capsys.readouterr().err.strip()
    return code, err


def one_line(err: str) -> str:
    assert err.startswith("palaestra: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_non_utf8_config_file(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("job: rl.train\nnote: café\n".encode("latin-1"))
    code, err = run(capsys, str(path), "--dry-run")
    byte = len(b"job: rl.train\nnote: caf")  # where the latin-1 \xe9 is
    assert code == 2 and f"latin1.yaml: not UTF-8 text (byte {byte}: b'\\xe9')" in one_line(err)


def test_recursive_anchor(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    path.write_text("job: rl.train\nenvs: &e [{name: task}, *e]\n")
    code, err = run(capsys, str(path), "--dry-run")
    assert code == 2 and "line 2: anchor '&e' is used inside itself" in one_line(err)


def test_an_anchor_used_after_itself_still_works(tmp_path):
    """A plain alias (not inside its own anchor) is ordinary YAML and still loads."""
    text = "job: rl.train\nllm: &m {model: tiny}\nworkers: {llm: *m}\n"
    assert config.load_yaml(text) == {
        "job": "rl.train",
        "llm": {"model": "tiny"},
        "workers": {"llm": {"model": "tiny"}},
    }


def test_billion_laughs_is_refused_at_once(tmp_path, capsys):
    lines = ["job: rl.train", 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")  # 9^9 = 387M strings once expanded
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    code, err = run(capsys, str(path), "--dry-run")
    assert time.monotonic() - start < 10  # it ran past 120 s before
    assert code == 2 and f"more than {config.MAX_YAML_NODES} values once its aliases are expanded" in one_line(err)


def test_oversized_config_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(config, "MAX_YAML_BYTES", 64)
    path = tmp_path / "big.yaml"
    path.write_text("job: rl.train\n" + "# padding\n" * 10)
    code, err = run(capsys, str(path), "--dry-run")
    assert code == 2 and "big.yaml: 114 bytes; a config may have at most 64" in one_line(err)


def test_every_experiment_config_is_within_the_bounds():
    root = Path(__file__).resolve().parents[2] / "experiments"
    for path in root.rglob("*.yaml"):
        assert isinstance(config.load_yaml(path.read_bytes(), str(path)), dict), path


def write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump({**data, "output_dir": str(tmp_path / "out")}))
    return str(path)


def test_missing_peft_for_lora(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # as if the `lora` extra were not installed
    code, err = run(capsys, write(tmp_path, {**RL, "lora": {"enabled": True}}))
    assert code == 2 and "LoRA (lora.enabled) needs peft: pip install 'palaestra-shared[lora]'" in one_line(err)


def test_missing_ray_for_the_sharded_learner(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the `ray` extra were not installed
    code, err = run(capsys, write(tmp_path, {**RL, "learner": {"world_size": 2}}))
    assert code == 2 and "needs ray: pip install 'palaestra-shared[ray]'" in one_line(err)


def test_errors_raised_in_a_ray_worker_are_one_line():
    """The text Ray gives the driver for an actor whose constructor raised (Ray 2.x's ActorDiedError.error_msg)."""

    class ActorDiedError(Exception):
        __module__ = "ray.exceptions"

        def __init__(self, error_msg: str):
            super().__init__(error_msg)
            self.error_msg = error_msg

    trace = (
        "The actor died because of an error raised in its creation task, \x1b[36mray::RolloutWorker.__init__()\x1b[39m"
        ' (pid=1)\n  File "workers.py", line 60, in __init__\n{}'
    )
    llm = trace.format("palaestra.shared.llm.base.LLMError: the vllm backend needs vLLM on a GPU node")
    assert cli.one_line_error(ActorDiedError(llm)) == "the vllm backend needs vLLM on a GPU node (in a Ray worker)"
    missing = trace.format("ModuleNotFoundError: No module named 'vllm'")
    assert cli.one_line_error(ActorDiedError(missing)) == (
        "the vllm backend (GPU nodes) needs vllm: pip install 'palaestra-shared[vllm]' (in a Ray worker)"
    )
    assert cli.one_line_error(ActorDiedError(trace.format("ZeroDivisionError: division by zero"))) is None  # a bug
    assert cli.one_line_error(ModuleNotFoundError("No module named 'numpyy'", name="numpyy")) is None


@pytest.mark.slow
def test_vllm_on_ray_workers_without_vllm(ray_local, tmp_path, capsys):
    pytest.importorskip("ray")
    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    data = {**RL, "workers": {"num_workers": 1, "llm": {"backend": "vllm", "model": "tiny"}}}
    data["cluster"] = {"num_cpus": 2, "object_store_mb": 128}
    code, err = run(capsys, write(tmp_path, data))
    assert code == 2
    # the worker keeps the error and the driver raises it: one line, without the worker's traceback in Ray's log
    assert (
        one_line(err)
        == "palaestra: error: the vllm backend needs vLLM on a GPU node: pip install 'palaestra-shared[vllm]'"
    )


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest rewritten", "file swapped"])
def test_crafted_trainer_state(tmp_path, capsys, manifest):
    """A checkpoint whose trainer_state.pt carries a pickled call: refused in one line, and the call never runs."""
    import torch

    from palaestra.shared.llm import LLMConfig, make_client
    from palaestra.shared.rl import checkpoint

    step = tmp_path / "out" / "checkpoints" / "step_000001"
    client = make_client(LLMConfig(model="tiny", device="cpu"))
    client.model.save_pretrained(step)
    client.tokenizer.save_pretrained(step)
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "optimizer": {}, "rng": _Payload(marker)}, step / "trainer_state.pt")
    write_manifest = getattr(checkpoint, "write_manifest", None)
    if write_manifest is not None and manifest:
        write_manifest(step)
    elif write_manifest is not None:  # the manifest of a genuine state, then the file swapped for the crafted one
        crafted = (step / "trainer_state.pt").read_bytes()
        torch.save({"step": 1, "optimizer": {}, "rng": {}}, step / "trainer_state.pt")
        write_manifest(step)
        (step / "trainer_state.pt").write_bytes(crafted)
    code, err = run(capsys, write(tmp_path, {**RL, "resume": True}))
    assert code == 2 and not marker.exists()
    line = one_line(err)
    assert "trainer_state.pt: its sha256 differs" in line or "nothing in it ran): Unsupported global" in line
    with pytest.raises(pickle.UnpicklingError):  # the file is a real payload, refused by weights_only
        torch.load(step / "trainer_state.pt", weights_only=True)
