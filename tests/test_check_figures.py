"""tools/check_figures.py: every entry names a figure its README still states, a config that exists, the commit
that recorded it; the readers turn MLflow metrics, or what a command printed, into the README's wording."""

import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_figures", ROOT / "tools" / "check_figures.py")
check_figures = importlib.util.module_from_spec(spec)
sys.modules["check_figures"] = check_figures  # its dataclasses look their module up
spec.loader.exec_module(check_figures)


@pytest.mark.parametrize("figure", check_figures.FIGURES, ids=lambda f: f.name)
def test_entry_points_at_a_real_figure(figure):
    if isinstance(figure, check_figures.Printed):  # the config or script it names
        assert figure.argv[0] in ("palaestra", "python")
        assert [a for a in figure.argv[1:] if a.endswith((".yaml", ".py")) and (ROOT / a).is_file()]
    else:
        assert (ROOT / figure.config).is_file()
    assert figure.written in (ROOT / figure.readme).read_text(), f"{figure.readme} no longer says {figure.written!r}"
    commit = subprocess.run(["git", "cat-file", "-t", figure.recorded_in], cwd=ROOT, capture_output=True, text=True)
    if commit.returncode == 0 or "not a git repository" not in commit.stderr:
        assert commit.stdout.strip() == "commit"


@dataclass
class Point:
    value: float
    step: int
    timestamp: int = 0


class FakeClient:
    def __init__(self, metrics, history):
        self.metrics, self.history = metrics, history

    def get_run(self, run_id):
        data = type("Data", (), {"metrics": self.metrics})
        return type("Run", (), {"data": data})

    def get_metric_history(self, run_id, key):
        return [Point(v, i) for i, v in enumerate(self.history.get(key, []))]


def test_readers_write_the_readme_wording():
    toy = FakeClient(
        {
            "result/eval_before_reward_mean": 0.301,
            "result/eval_before_reward_ci95": 0.08,
            "result/eval_after_reward_mean": 0.948,
            "result/eval_after_reward_ci95": 0.04,
        },
        {},
    )
    assert check_figures.eval_before_after(toy, "r") == "0.30 ± 0.08 -> 0.95 ± 0.04"
    rewards = [0.0] * 5 + [0.1] * 5 + [0.2] * 5 + [0.3] * 5  # steps 1-10 mean 0.05, 11-20 mean 0.25
    egpo = FakeClient({}, {"train/reward_mean": rewards})
    assert check_figures.train_reward_halves(egpo, "r") == (
        "0.050 over steps 1-10 -> 0.250 over steps 11-20 (first 5: 0.000, last 5: 0.300)"
    )
    data = FakeClient({"result/kept": 387.0, "result/dropped": 13.0, "stats/calls_per_trace": 3.912}, {})
    assert check_figures.datagen_kept(data, "r") == "387 of 400 items kept, 3.91 calls per trace"
    kuhn = FakeClient(
        {"eval/kuhn_poker/exploitability": 0.2, "eval/kuhn_poker/equilibrium_exploitability": 0.0},
        {"eval/kuhn_poker/exploitability": [0.354, 0.3, 0.226]},
    )
    assert check_figures.kuhn_exploitability(kuhn, "r") == "0.354 -> 0.226"
    assert check_figures.kuhn_control(kuhn, "r") == "RL-free control 0.226"
    mine = FakeClient({}, {"mine/weak_target_share": [0.0, 0.7142857]})
    assert check_figures.mine_weak_target_share(mine, "r") == "weak_target_share 0.714"


def test_printed_readers_write_the_readme_wording():
    plan = "learner\n  total    40.78  fits\ntrainer 35.18 GB  fits\nGPUs: 8 of 8\nevaluation time: 2.2 h\nplan: fits\n"
    assert (
        check_figures.lines_between("total", "GPUs:")(plan)
        == "  total    40.78  fits\ntrainer 35.18 GB  fits\nGPUs: 8 of 8"
    )
    assert (
        check_figures.lines_between("trainer", "GPUs", "    ")(plan) == "    trainer 35.18 GB  fits\n    GPUs: 8 of 8"
    )
    with pytest.raises(KeyError):
        check_figures.lines_between("probe:", "kept")(plan)
    assert check_figures.plan_cpu_hours("x\nall stages: 0.7 CPU-hours\npipeline plan: fits") == "about 0.7 CPU-hours"
    reference = """| policy | vs random: first seat | second seat | both |
| --- | --- | --- | --- |
| random | 0.585 | 0.288 | 0.437 |
| first listed | 0.781 | 0.440 | 0.611 |
| first or second listed | 0.672 | 0.372 | 0.522 |
| win-maximizing (optimal vs random) | 0.995 | 0.939 | 0.967 |
"""
    assert check_figures.tictactoe_reference(reference) == (
        "uniform random 0.437, the warm start's own target 0.522, always the first listed move 0.611, optimal 0.967"
    )


def test_the_readme_blocks_are_what_the_readers_return_from_them():
    """The code blocks as written read back as themselves (a reader that drops or re-indents a line shows here)."""
    for figure in check_figures.FIGURES:
        if isinstance(figure, check_figures.Printed) and "\n" in figure.written:
            text = (ROOT / figure.readme).read_text()
            start = text.index(figure.written)
            block = text[start : text.index("\n", start + len(figure.written))]
            printed = "\n".join(line.removeprefix("    ") for line in block.splitlines())  # the code block's indent
            assert figure.read(printed) == figure.written
