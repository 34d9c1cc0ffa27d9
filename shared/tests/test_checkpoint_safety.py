"""Loading a trainer checkpoint never runs code from it: every file is checked against the manifest written at
save (the sharded learner's pickled ``sharded/.metadata`` included), and ``trainer_state.pt`` is read with
``torch.load(weights_only=True)``."""

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from palaestra.shared.rl import checkpoint


class _Payload:
    """Unpickling this touches a marker file: what a crafted checkpoint would do with os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _checkpoint_dir(tmp_path: Path) -> tuple[Path, torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    ckpt = tmp_path / "step_000001"
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, ckpt / "model.safetensors")
    return ckpt, model, torch.optim.AdamW(model.parameters(), lr=0.1)


def test_crafted_pickle_in_trainer_state_does_not_run(tmp_path):
    ckpt, model, optimizer = _checkpoint_dir(tmp_path)
    marker = tmp_path / "pwned"
    state = {"step": 1, "optimizer": optimizer.state_dict(), "rng": _Payload(marker)}
    torch.save(state, ckpt / "trainer_state.pt")
    checkpoint.write_manifest(ckpt)  # even a run that wrote it itself: weights_only refuses the payload
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(ckpt, [checkpoint.Part("", model, optimizer)])
    assert not marker.exists()
    # the same file loaded the unsafe way would have run the payload: the test's payload is real
    torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert marker.exists()


def test_genuine_trainer_state_round_trips(tmp_path):
    ckpt, model, optimizer = _checkpoint_dir(tmp_path)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    torch.save({"step": 5, "rng": checkpoint.rng_state(), "sections": [""]}, ckpt / "trainer_state.pt")
    torch.save({"optimizer": optimizer.state_dict()}, ckpt / "optimizer.pt")
    checkpoint.write_manifest(ckpt)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert checkpoint.load(ckpt, [checkpoint.Part("", model, fresh)]) == 5
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected  # RNG states restored
    saved = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], saved)


def _sharded_checkpoint(tmp_path: Path, tiny_llm) -> tuple[Path, torch.nn.Module, torch.optim.Optimizer]:
    """A checkpoint as `checkpoint.save` writes it, with a sharded learner's torch.distributed.checkpoint files
    (written here by one process: the same format and the same ``.metadata`` pickle as a world-size-2 run)."""
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(3, 2)
    hf = tiny_llm.model

    def sharded(path: Path) -> None:
        dcp.save({"model": {k: v.clone() for k, v in model.state_dict().items()}}, checkpoint_id=str(path / "sharded"))

    part = checkpoint.Part("", hf, torch.optim.AdamW(hf.parameters()), tiny_llm.tokenizer)
    ckpt = checkpoint.save(tmp_path, 3, [part], sharded)
    assert (ckpt / "sharded" / ".metadata").is_file() and (ckpt / checkpoint.MANIFEST).is_file()
    return ckpt, hf, torch.optim.AdamW(hf.parameters())


@pytest.mark.filterwarnings("ignore::UserWarning")  # dcp without a process group
def test_crafted_sharded_metadata_is_refused_before_anything_reads_it(tmp_path, tiny_llm):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    ckpt, model, optimizer = _sharded_checkpoint(tmp_path, tiny_llm)
    assert checkpoint.load(ckpt, [checkpoint.Part("", model, optimizer)]) == 3  # the genuine checkpoint loads
    marker = tmp_path / "pwned"
    (ckpt / "sharded" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(checkpoint.CheckpointError, match=r"sharded/\.metadata: its sha256 differs") as err:
        checkpoint.load(ckpt, [checkpoint.Part("", model, optimizer)])
    assert "\n" not in str(err.value)
    assert not marker.exists()
    # torch's own loader, given the same directory, runs the payload: the file is a real attack
    with pytest.raises(CheckpointException):  # the payload returns None, not metadata: dcp fails after running it
        dcp.load({"model": {"weight": torch.zeros(2, 3)}}, checkpoint_id=str(ckpt / "sharded"))
    assert marker.exists()


@pytest.mark.parametrize("change", ["edit", "add", "remove", "no manifest"])
def test_any_change_to_a_saved_checkpoint_is_refused_naming_the_file(tmp_path, tiny_llm, change):
    ckpt, model, optimizer = _sharded_checkpoint(tmp_path, tiny_llm)
    data = sorted((ckpt / "sharded").glob("*.distcp"))[0]
    if change == "edit":
        data.write_bytes(data.read_bytes() + b"\0")
        named, why = data, "sha256 differs"
    elif change == "add":
        named, why = ckpt / "sharded" / "__9_0.distcp", "not in the checkpoint's manifest"
        named.write_bytes(b"x")
    elif change == "remove":
        data.unlink()
        named, why = data, "missing"
    else:
        (ckpt / checkpoint.MANIFEST).unlink()
        named, why = ckpt / checkpoint.MANIFEST, "missing"
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load(ckpt, [checkpoint.Part("", model, optimizer)])
    assert str(err.value).startswith(f"{named}: ") and why in str(err.value)


def test_reference_model_is_checked_too(tmp_path, tiny_llm):
    checkpoint.save_reference(tmp_path, tiny_llm.model)
    checkpoint.load_reference(tmp_path, tiny_llm.model)
    weights = tmp_path / "reference" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\1")
    with pytest.raises(checkpoint.CheckpointError, match="model.safetensors: its sha256 differs"):
        checkpoint.load_reference(tmp_path, tiny_llm.model)


@pytest.mark.slow
def test_a_two_rank_resume_refuses_a_crafted_sharded_metadata(tmp_path, ray_local):
    """The issue's case end to end: a world-size-2 run's ``sharded/.metadata`` replaced by a crafted pickle; the
    resumed trainer refuses it before any rank reads it (before, a learner rank ran it)."""
    import dataclasses

    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.rl.config import EnvSpec, LearnerConfig, TrainConfig
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.rollout.engine import RolloutConfig
    from palaestra.shared.testing import TEST_CLUSTER

    cfg = TrainConfig(
        job="rl.train",
        envs=[EnvSpec("task", {"source": "next_number"})],
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        rollout=RolloutConfig(group_size=2, max_tokens_per_turn=4),
        learner=LearnerConfig(world_size=2, strategy="fsdp"),
        cluster=TEST_CLUSTER,
        steps=1,
        tasks_per_step=2,
    )
    with Trainer(cfg) as trainer:
        trainer.prepare()  # the two ranks hold the sharded weights and optimizer state
        trainer.save()
    ckpt = tmp_path / "out" / "checkpoints" / "step_000000"
    assert (ckpt / "sharded" / ".metadata").is_file()
    marker = tmp_path / "pwned"
    (ckpt / "sharded" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    resumed = Trainer(dataclasses.replace(cfg, resume=True))
    with resumed, pytest.raises(checkpoint.CheckpointError, match=r"sharded/\.metadata: its sha256 differs"):
        resumed.prepare()
    assert not marker.exists()
