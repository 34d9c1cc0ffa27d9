"""Multi-turn training episodes from datagen's rows (`palaestra.egpo.multiturn_data`): conversion, per-turn
rewards from BFCL's checker, and the multi-turn CPU config (MARS's turn-level advantage) running."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import mlflow
import pytest

pytestmark = pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "egpo"


def datagen_rows(category: str, limit: int) -> list[dict]:
    """BFCL entries written as datagen writes its rows (JSON-text tools and state, held-out names per turn)."""
    from palaestra.egpo.bfcl import load_category

    rows = []
    for entry, truth in load_category(category, limit):
        held = entry.get("missed_function") or {}
        docs = list(entry["function"]) + [d for docs in held.values() for d in docs]
        rows.append(
            {
                "id": entry["id"],
                "turns": [{"kind": "normal", "query": q[0]["content"] if q else ""} for q in entry["question"]],
                "ground_truth": truth,
                "initial_config": json.dumps(entry["initial_config"]),
                "involved_classes": entry["involved_classes"],
                "tools": json.dumps(docs),
                "missed_function": [{"turn": int(k), "functions": [d["name"] for d in v]} for k, v in held.items()],
                "messages": [],
            }
        )
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def play(env, seed: int, wrong_turn: int | None = None) -> list[float]:
    """The ground-truth oracle through the env; at `wrong_turn` it answers without the due calls."""
    from palaestra.egpo.eval import oracle_answer
    from palaestra.egpo.multiturn import ground_truth_turn_calls

    env.reset(seed)
    env.oracle_calls = ground_truth_turn_calls(env.entry, env.ground_truth)
    rewards = []
    for _ in range(100):
        env.observe("agent")
        due = env.turn == wrong_turn and env.steps_in_turn == 0 and env.oracle_calls[env.turn]
        step = env.step("<think>x</think>Done." if due else oracle_answer(env, wrong=False))
        rewards.append(step.rewards.get("agent", 0.0))
        if step.done:
            return rewards
    raise AssertionError("episode did not end")


@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_func"])
def test_rows_play_as_bfcl_episodes_with_a_reward_per_turn(tmp_path, category):
    from palaestra.shared.rollout.env import ENVS

    path = write_rows(tmp_path / "rows.jsonl", datagen_rows(category, 3))
    env = ENVS.get("datagen_multi_turn")(path=str(path))
    for seed in range(3):
        rewards = play(env, seed)
        turns = len(env.ground_truth)
        assert sum(rewards) == pytest.approx(1.0) and env.result["valid"]
        assert sorted(r for r in rewards if r) == [pytest.approx(1 / turns)] * turns  # one 1/T per user turn
    # a due turn answered without calls: the turns before it are paid, none from it on
    env.reset(0)
    due = [i for i, calls in enumerate(env.ground_truth) if calls]
    wrong = due[1] if len(due) > 1 else due[0]
    rewards = play(env, 0, wrong_turn=wrong)
    assert sum(rewards) == pytest.approx(wrong / len(env.ground_truth))
    assert not env.result["valid"]
    # without per-turn rewards: 1 at the end or nothing
    whole = ENVS.get("datagen_multi_turn")(path=str(path), reward_per_turn=False)
    assert play(whole, 1)[-1] == 1.0 and sum(play(whole, 1)) == 1.0


def test_miss_func_rows_hold_the_functions_back_until_their_turn(tmp_path):
    from palaestra.egpo.multiturn_data import load_rows

    (entry, _), *_ = load_rows(write_rows(tmp_path / "r.jsonl", datagen_rows("multi_turn_miss_func", 1)))
    turn, docs = next(iter(entry["missed_function"].items()))
    names = {d["name"] for d in entry["function"]}
    assert docs and not names & {d["name"] for d in docs}  # held out of the first prompt's tools
    assert entry["question"][int(turn)] == []  # BFCL's held-out turn: the env adds the functions prompt
    with pytest.raises(ValueError, match="no 'turns'"):
        from palaestra.egpo.multiturn_data import entry_from_row

        entry_from_row({"messages": []}, 0)


@pytest.mark.slow  # a tiny SFT warm start, one RL step of multi-turn episodes
def test_multi_turn_cpu_config_runs_with_the_turn_level_advantage(tmp_path, tracking):
    from palaestra.shared.jobs import load_config, run_job
    from palaestra.shared.matrix import file_combinations

    stages = {c.values["arm"]: c.cfg for c in file_combinations(EXPERIMENTS / "multi_turn_ablation.yaml")}
    assert [a.name for a in stages["mars"].advantages] == ["turn_level", "agent_norm"]
    assert [a.name for a in stages["egpo"].advantages] == ["grpo", "entropy_clipped"]
    path = write_rows(tmp_path / "rows.jsonl", datagen_rows("multi_turn_base", 4))
    cfg = load_config(
        EXPERIMENTS / "multi_turn_cpu.yaml",
        [
            f"output_dir={tmp_path}",
            f"envs.0.kwargs.path={path}",
            "sft_warmup.source_kwargs.path=" + str(path).replace("rows", "sft"),
            "sft_warmup.steps=2",
            "sft_warmup.batch_size=2",
            "steps=1",
            "tasks_per_step=2",
            "rollout.group_size=2",
            "rollout.max_turns=4",
            "rollout.max_tokens_per_turn=16",
            "advantages=[{name: turn_level, options: {gamma: 1.0}}, {name: agent_norm}]",
        ],
    )
    # SFT data: the same episodes' single-turn tasks (fc_tasks reads rows with chat messages)
    from palaestra.egpo.bfcl import load_category

    sft_rows = []
    for entry, truth in load_category("multi_turn_base", 4):
        from palaestra.egpo.multiturn import ground_truth_turn_calls

        calls = ground_truth_turn_calls(entry, truth)[0][:1]
        sft_rows.append(
            {
                "query": entry["question"][0][0]["content"],
                "tools": entry["function"],
                "answers": [{"name": n, "arguments": a} for n, a in calls],
            }
        )
    write_rows(Path(str(path).replace("rows", "sft")), sft_rows)
    cfg.tracking = tracking
    out = run_job(cfg)
    assert out["steps"] == 1
    metrics = mlflow.MlflowClient(tracking.uri).get_run(out["run_id"]).data.metrics
    assert "train/reward_mean" in metrics
