"""Lossless resume under kill -9: toy asynchronous training (`tiny`, ``rollout.max_staleness`` 1, rollouts in the
learner's process, a checkpoint every step, ``resume: true``) runs in a subprocess through the trainer API; the
test kills it with SIGKILL at random points (a seeded draw of a step and a delay into it), starts it again each
time, and lets the last run finish. Against an uninterrupted run of the same config:

- the multiset of trained prompts (each step's tasks: group id and prompt tokens) is the same;
- with ``rollout.version_schedule: fixed``, also every trained token (and the version that sampled it) and the
  final weights, bit for bit. Negative control: a run of another seed differs in both.

With the fixed schedule in-process rollouts are a function of the version and the seed: a resumed run that
had lost the checkpoint's rollouts in flight (``rollouts_ahead.pkl``) would regenerate the same tokens, so the
file saves recomputation here, not data (found while writing this test's first control, which deleted it).

What a step trained on is recorded by the subprocess as it updates (`Trainer.update_policy`), one file per step
written atomically: a step killed before its checkpoint is trained again by the resumed run, whose record
replaces it, so the records are what the final weights were trained on.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

STEPS = 6
SCRIPT = """
import json, os, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import RolloutConfig
from palaestra.shared.rewards import REWARDS
from palaestra.shared.testing import small_train_config

@REWARDS.register("kill_test_length")  # rewards that differ within a group: every update moves the weights
def length(sample, completion, **info):
    return len(completion) / 10

out, records, schedule, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rollout = RolloutConfig(group_size=2, max_tokens_per_turn=4, max_staleness=1, version_schedule=schedule)
loss = LossConfig(behaviour_correction="tis", logprob_temperature=1.0)
cfg = small_train_config(out, "kill_test_length", rollout=rollout, loss=loss, steps=steps, checkpoint_every=1,
                         resume=True, keep_checkpoints=2, seed=int(sys.argv[5]))
trainer = Trainer(cfg)
update = trainer.update_policy

def recorded(policy, trajs):
    rows = [[t.group_id, [[tn.prompt_ids, tn.response_ids, tn.response_versions] for tn in t.turns]] for t in trajs]
    tmp = records / f".step_{trainer.step}.json"
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, records / f"step_{trainer.step}.json")
    return update(policy, trajs)

trainer.update_policy = recorded
trainer.train()
trainer.close()
torch.save(trainer.policies[0].model.state_dict(), out / "final.pt")
"""


def _start(tmp_path: Path, name: str, schedule: str, seed: int = 0) -> subprocess.Popen:
    out, records = tmp_path / name, tmp_path / name / "records"
    records.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    args = [sys.executable, str(script), str(out), str(records), schedule, str(STEPS), str(seed)]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]


def _records(tmp_path: Path, name: str) -> dict[int, list]:
    files = (tmp_path / name / "records").glob("step_*.json")
    return {int(f.stem.split("_")[1]): json.loads(f.read_text()) for f in files}


def _run(
    tmp_path: Path, name: str, schedule: str, kills: int, rng: random.Random, seed: int = 0
) -> tuple[dict[int, list], dict]:
    """Train to the end, killed with SIGKILL `kills` times and resumed: each time at a step drawn from those the
    run has yet to train, once this run has recorded it, after a drawn delay (mid-update, mid-checkpoint, or
    mid-rollout of the step ahead). Asserts every kill landed on a live run."""
    records, checkpoints = tmp_path / name / "records", tmp_path / name / "out" / "checkpoints"
    for _ in range(kills):
        done = max((int(d.name.split("_")[1]) for d in checkpoints.glob("step_*")), default=0)
        started = time.time()
        proc = _start(tmp_path, name, schedule, seed)
        target, into = rng.randrange(min(done, STEPS - 3), STEPS - 2), rng.uniform(0.0, 0.8)  # 2+ steps to go
        record = records / f"step_{target}.json"
        deadline = time.monotonic() + 300
        while not (record.exists() and record.stat().st_mtime >= started) and proc.poll() is None:
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.01)
        time.sleep(into * _step_seconds(records, target, started))  # into the next step, whatever the machine's pace
        assert proc.poll() is None, f"the run ended before its kill at step {target}: {proc.communicate()[1][-2000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _finish(_start(tmp_path, name, schedule, seed))
    return _records(tmp_path, name), torch.load(tmp_path / name / "final.pt")


def _step_seconds(records: Path, step: int, started: float) -> float:
    """How long this run's last step took (between its records of steps `step` - 1 and `step`; 0.1 s when
    `step` is its first), at most 0.4 s: a kill that waits a fraction of it lands before the 2+ steps left end."""
    now, before = records / f"step_{step}.json", records / f"step_{step - 1}.json"
    if not (before.exists() and before.stat().st_mtime >= started):
        return 0.1
    return min(max(now.stat().st_mtime - before.stat().st_mtime, 0.0), 0.4)


def _prompts(records: dict[int, list]) -> Counter:
    return Counter((gid, json.dumps([turn[0] for turn in turns])) for rows in records.values() for gid, turns in rows)


@pytest.mark.parametrize("schedule", ["fixed", "newest"])
def test_kill_9_and_resume_trains_on_what_an_uninterrupted_run_does(tmp_path, schedule):
    straight, final = _run(tmp_path, "straight", schedule, kills=0, rng=random.Random(0))
    killed, resumed_final = _run(tmp_path, "killed", schedule, kills=3, rng=random.Random(1))
    assert sorted(straight) == sorted(killed) == list(range(STEPS))  # every step trained, none twice
    assert sum(len(rows) for rows in straight.values()) == STEPS * 2 * 2  # 2 tasks x 2 samples a step
    assert _prompts(killed) == _prompts(straight)
    if schedule == "fixed":  # the run is a function of its config: every token, version and weight
        assert killed == straight
        assert resumed_final.keys() == final.keys()
        assert all(torch.equal(resumed_final[n], final[n]) for n in final)
        # negative control: a run that trains on other samples (seed 1) fails these checks
        other, other_final = _run(tmp_path, "other", schedule, kills=0, rng=random.Random(2), seed=1)
        assert other != straight
        assert not all(torch.equal(other_final[n], final[n]) for n in final)
