"""experiments/egpo/qwen3_4b_bfcl.yaml: the public sets and the multi-turn environment in the mixture, its
comment's task and step counts computed from its settings, BFCL's prompt and decoder at the end, and its data
spec run offline against a hub cache built from the fixture files."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from palaestra.shared.jobs import load_config

CONFIG = Path(__file__).resolve().parents[3] / "experiments" / "egpo" / "qwen3_4b_bfcl.yaml"
DATA = Path(__file__).parent / "data" / "public"
MULTI_TURN = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_paper_config_mixture_and_evaluation():
    cfg = load_config(CONFIG)
    task, multi = cfg.envs
    assert (task.name, task.kwargs["source"], task.kwargs["reward"]) == ("task", "public_fc_tasks", "fc_binary")
    kwargs = task.kwargs["source_kwargs"]
    assert [s["format"] for s in kwargs["sources"]] == ["xlam", "apigen_mt", "funreason_mt", "hardgen"]
    assert kwargs["contamination"] == "drop" and kwargs["report_path"] == f"{cfg.output_dir}/data_report.json"
    assert multi.name == "datagen_multi_turn" and multi.kwargs["reward_per_turn"] is True
    assert cfg.rollout.max_turns > 1  # the multi-turn episodes get more than one model call
    assert (cfg.eval.prompt, cfg.eval.decoder) == ("bfcl_fc", "bfcl")
    assert set(MULTI_TURN) <= set(cfg.eval.categories)


def test_comment_states_the_task_and_step_counts_the_settings_imply():
    cfg = load_config(CONFIG)
    single = sum(s["limit"] for s in cfg.envs[0].kwargs["source_kwargs"]["sources"])
    multi = cfg.envs[1].kwargs["limit"]
    total = single + multi
    per_epoch = total / cfg.tasks_per_step
    steps = math.ceil(cfg.epochs * total / cfg.tasks_per_step)
    comment = " ".join(line.lstrip("# ") for line in CONFIG.read_text().splitlines() if line.startswith("#"))
    assert _number(re.search(r"= ([\d,]+) records", comment)[1]) == single  # caps count records (issue 36)
    found = re.search(r"that would be ([\d,]+) \+ ([\d,]+) = ([\d,]+)", comment)  # one task per record
    assert tuple(_number(g) for g in found.groups()) == (single, multi, total)
    assert _number(re.search(r"([\d.]+) steps per epoch", comment)[1]) == round(per_epoch, 1)
    assert "steps = ceil(5 x tasks / 128)" in comment and cfg.epochs == 5 and cfg.tasks_per_step == 128
    found = re.search(r"ceil\((\d+) x ([\d,]+) / (\d+)\) = ([\d,]+) steps", comment)
    assert tuple(_number(g) for g in found.groups()) == (cfg.epochs, total, cfg.tasks_per_step, steps)


@pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")
def test_paper_data_spec_offline_against_a_hub_cache(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from palaestra.shared.rollout.tasks import TASKS

    files = {  # hub repo -> the fixture written in its release's layout
        "Salesforce/xlam-function-calling-60k": "xlam_function_calling_60k.json",
        "Salesforce/APIGen-MT-5k": "apigen-mt_5k.json",
        "Bingguang/FunReason-MT": "bfcl_multi_turn.json",
        "Bingguang/HardGen": "hardgen.jsonl",
    }
    for k, (repo, name) in enumerate(files.items()):
        root = tmp_path / "hub" / f"datasets--{repo.replace('/', '--')}"
        commit = f"{k:040x}"
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(commit)
        (root / "snapshots" / commit).mkdir(parents=True)
        shutil.copy(DATA / name, root / "snapshots" / commit / name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load_config(CONFIG, [f"output_dir={tmp_path}/run"])
    env = cfg.envs[0].kwargs
    samples = TASKS.get(env["source"])(**env["source_kwargs"])
    data_report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    report = data_report["sources"]
    # turns: every on the three multi-turn sets: a task at every assistant message (the APIGen-MT and HardGen
    # fixtures hold one record of 4 assistant messages, FunReason-MT's two); xLAM one task per record
    assert {k: (v["checked"], v["contaminated"], v["kept"]) for k, v in report.items()} == {
        "xlam": (4, 1, 3),
        "apigen_mt": (4, 0, 4),
        "funreason_mt": (8, 0, 8),
        "hardgen": (4, 0, 4),
    }
    # the data report: records and tasks per source and the multi-turn share (a prompt with an earlier answer or
    # a tool result: 3 of the 4 steps of each multi-turn record)
    assert {k: (v["records"], v["tasks"], v["multi_turn_tasks"]) for k, v in report.items()} == {
        "xlam": (4, 4, 0),
        "apigen_mt": (1, 4, 3),
        "funreason_mt": (2, 8, 6),
        "hardgen": (1, 4, 3),
    }
    assert data_report["totals"] == {"records": 8, "tasks": 20, "multi_turn_tasks": 12, "kept": 19,
                                     "multi_turn_share": 0.6}  # fmt: skip
    assert len(samples) == 19
