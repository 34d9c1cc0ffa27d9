"""Loading a trainer checkpoint never runs code from it (``torch.load(weights_only=True)``)."""

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
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(ckpt, model, optimizer)
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
    torch.save(
        {"step": 5, "optimizer": optimizer.state_dict(), "rng": checkpoint.rng_state()}, ckpt / "trainer_state.pt"
    )
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert checkpoint.load(ckpt, model, fresh) == 5
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected  # RNG states restored
    saved = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], saved)
