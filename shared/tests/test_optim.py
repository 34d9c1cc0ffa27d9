"""The learner's learning-rate schedule (rl/optim.py) against transformers' own schedulers (the trainer's use of
it: test_trainer.py)."""

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup
from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config
from palaestra.shared.rl.config import OptimConfig
from palaestra.shared.rl.optim import learning_rate, make_optimizer


def _hf_rates(make, steps: int, lr: float) -> list[float]:
    """The rate transformers' scheduler gives each optimizer step: step k runs after k scheduler.step() calls."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = make(optimizer)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("warmup", [0, 1, 10])
def test_schedules_equal_transformers(warmup):
    steps, lr = 40, 1e-3
    constant = OptimConfig(lr=lr, warmup_steps=warmup)
    cosine = OptimConfig(lr=lr, warmup_steps=warmup, schedule="cosine")
    floor = OptimConfig(lr=lr, warmup_steps=warmup, schedule="cosine", min_lr=1e-4)
    hf = {
        "constant": _hf_rates(lambda o: get_constant_schedule_with_warmup(o, warmup), steps, lr),
        "cosine": _hf_rates(lambda o: get_cosine_schedule_with_warmup(o, warmup, steps), steps, lr),
        "floor": _hf_rates(
            lambda o: get_cosine_with_min_lr_schedule_with_warmup(o, warmup, steps, min_lr=1e-4), steps, lr
        ),
    }
    for name, optim in (("constant", constant), ("cosine", cosine), ("floor", floor)):
        ours = [learning_rate(optim, s, steps) for s in range(steps)]
        assert ours == pytest.approx(hf[name], rel=1e-9, abs=1e-15), name


def test_closed_form_points():
    optim = OptimConfig(lr=1e-3, warmup_steps=10, schedule="cosine")
    assert learning_rate(optim, 0, 30) == 0.0  # the first update of a warmup moves nothing
    assert learning_rate(optim, 5, 30) == pytest.approx(5e-4)
    assert learning_rate(optim, 10, 30) == pytest.approx(1e-3)  # the peak, where the cosine starts
    assert learning_rate(optim, 20, 30) == pytest.approx(5e-4)  # halfway down: (1 + cos(pi / 2)) / 2


def test_optimizer_takes_betas_and_weight_decay():
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(2))], OptimConfig(betas=[0.9, 0.95], weight_decay=0.05))
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.95) and group["weight_decay"] == 0.05


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.betas=[0.9]", "optim.betas"),
        ("optim.warmup_steps=-1", "optim.warmup_steps"),
        ("optim.min_lr=0.1", "optim.min_lr"),
        ("optim.schedule=cosin", "cosine"),
    ],
)
def test_bad_schedule_settings_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"job": "rl.train", "optim": {"lr": 1e-3}}, [override])
