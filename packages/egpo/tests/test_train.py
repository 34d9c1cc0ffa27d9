"""egpo.train through the shared trainer, and the experiment configs."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.matrix import file_combinations
from palaestra.shared.pipeline import stage_configs

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "egpo"


def test_configs_resolve():
    tiny = load_config(EXPERIMENTS / "tiny_cpu.yaml")
    assert [a.name for a in tiny.advantages] == ["grpo", "entropy_clipped"]
    paper = load_config(EXPERIMENTS / "qwen3_4b_bfcl.yaml")
    assert paper.llm.model == "Qwen/Qwen3-4B-Instruct-2507" and paper.workers.llm.backend == "vllm"
    assert paper.optim.lr == 1e-6 and paper.rollout.temperature == 0.7 and paper.loss.kl_coef == 0.001
    assert paper.rollout.max_tokens_per_turn == 8192
    assert paper.advantages[1].options == {"lam": 0.4, "alpha": 2.0}


def test_ablation_arms_differ_in_the_advantage_key_only():
    """ablation.yaml: tiny_cpu.yaml as two arms of a matrix, one key apart."""
    arms = {c.values["arm"]: c.cfg for c in file_combinations(EXPERIMENTS / "ablation.yaml")}
    grpo, egpo = arms["grpo"], arms["egpo"]
    assert [a.name for a in grpo.advantages] == ["grpo"]
    assert [a.name for a in egpo.advantages] == ["grpo", "entropy_clipped"]
    same = {k for k in vars(grpo) if getattr(grpo, k) == getattr(egpo, k)}
    assert set(vars(grpo)) - same == {"advantages", "output_dir"}
    tiny = load_config(EXPERIMENTS / "tiny_cpu.yaml")
    assert {k for k in vars(egpo) if getattr(egpo, k) != getattr(tiny, k)} == {"output_dir", "tracking"}


@pytest.mark.slow
def test_egpo_train_runs_and_logs(tmp_path, tracking):
    cfg = load_config(
        EXPERIMENTS / "tiny_cpu.yaml",
        [
            f"output_dir={tmp_path}",
            "sft_warmup.steps=2",
            "sft_warmup.batch_size=2",
            "steps=2",
            "tasks_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens_per_turn=12",
            "eval.categories=[simple_python,multi_turn_base]",
            "eval.limit=1",
            "eval.max_tokens_per_turn=8",
            "eval.max_model_calls=2",
            "eval.prompt=bfcl_fc",
            "eval.decoder=bfcl",
        ],
    )
    cfg.tracking = tracking
    out = run_job(cfg)
    assert out["steps"] == 2
    run = mlflow.MlflowClient(tracking.uri).get_run(out["run_id"])
    assert run.data.tags["bfcl.prompt"] == "bfcl_fc" and run.data.tags["bfcl.decoder"] == "bfcl"  # eval's settings
    metrics = run.data.metrics
    assert "train/reward_mean" in metrics and "bfcl/simple_python/accuracy" in metrics
    assert "bfcl/multi_turn_base/accuracy" in metrics
    assert 0 <= metrics["adv/entropy_changed_share"] <= 1  # EGPO's term reports its effect each step


@pytest.mark.skipif(not __import__("importlib").util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")
def test_bfcl_multi_turn_env_for_training_plays_entry_by_seed():
    from palaestra.egpo.eval import oracle_answer
    from palaestra.egpo.multiturn import ground_truth_turn_calls
    from palaestra.shared.rollout.env import ENVS

    env = ENVS.get("bfcl_multi_turn")(category="multi_turn_miss_param", limit=5)
    for seed, expected_id in ((3, "multi_turn_miss_param_3"), (7, "multi_turn_miss_param_2")):
        assert env.reset(seed)["id"] == expected_id
        env.oracle_calls = ground_truth_turn_calls(env.entry, env.ground_truth)
        first = env.observe("agent")
        assert first[0]["role"] == "system" and env.tools("agent")
        for _ in range(50):
            step = env.step(oracle_answer(env, wrong=False))
            if step.done:
                break
            assert all(m["role"] in ("tool", "user") for m in env.observe("agent"))
        assert step.rewards == {"agent": 1.0} and step.info["multi_turn_valid"]


def test_smollm2_cpu_arms_differ_in_the_advantage_key_only():
    """smollm2_cpu.yaml: the warm start and its evaluations; smollm2_cpu_rl.yaml: EGPO vs GRPO over seeds 0-2 from
    its SFT model, one key apart, with the same BFCL entries, and the 0-step control."""
    ws = stage_configs(load_config(EXPERIMENTS / "smollm2_cpu.yaml"))
    sft = ws["sft"]
    evals = [ws["baseline"], ws["sft_eval"]]
    assert ws["sft_eval"].llm.model == sft.save_dir
    rl_file = EXPERIMENTS / "smollm2_cpu_rl.yaml"
    combos = {(c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(rl_file)}
    assert set(combos) == {(s, a) for s in (0, 1, 2) for a in ("egpo", "grpo", "sft_steps0")}
    for seed in (0, 1, 2):
        e, g, c = (stage_configs(combos[seed, a]) for a in ("egpo", "grpo", "sft_steps0"))
        e8, g8 = e["rl"], g["rl"]
        assert {k for k in vars(g8) if getattr(g8, k) != getattr(e8, k)} == {"advantages", "output_dir"}
        assert g8.seed == e8.seed == seed and e8.llm.model == sft.save_dir  # RL starts from the SFT model
        assert all(ev.categories == list(e8.eval.categories) and ev.limits == dict(e8.eval.limits) for ev in evals)
        assert [a.name for a in e8.advantages] == ["grpo", "entropy_clipped"]
        assert [a.name for a in g8.advantages] == ["grpo"]
        # the control: the GRPO arm with 0 steps, no multi-turn stage
        assert list(c) == ["rl"] and c["rl"].steps == 0
        assert {k for k in vars(g8) if getattr(g8, k) != getattr(c["rl"], k)} == {"steps", "output_dir"}
        # each arm's final checkpoint (the trainer's layout) under the warm start's multi-turn settings
        mt, sft_mt = e["rl_mt"], ws["sft_eval_mt"]
        assert mt.llm.model == f"{e8.output_dir}/checkpoints/step_{e8.steps:06d}"
        differ = {k for k in vars(mt) if getattr(mt, k) != getattr(sft_mt, k)}
        assert differ <= {"llm", "output_dir", "tracking", "seed"} and "llm" in differ
    # multi_turn_base: the baseline and the SFT model under the same evaluation settings
    base_mt, sft_mt = ws["baseline_mt"], ws["sft_eval_mt"]
    assert {k for k in vars(base_mt) if getattr(base_mt, k) != getattr(sft_mt, k)} == {"llm", "output_dir", "tracking"}
    assert base_mt.categories == ["multi_turn_base"] and sft_mt.llm.model == sft.save_dir


def test_fc_tasks_max_tools_and_first_turn_only(tmp_path):
    from palaestra.egpo.fc_tasks import fc_tasks

    record = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "t3", "arguments": "{}"}}]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "t1", "arguments": "{}"}}]},
        ],
        "tools": [{"name": f"t{i}", "parameters": {"type": "object", "properties": {}}} for i in range(6)],
    }
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(record) + "\n")
    every = fc_tasks(path=str(path))
    assert [len(s["tools"]) for s in every] == [6, 6]
    first = fc_tasks(path=str(path), first_turn_only=True, max_tools=2)
    assert len(first) == 1 and [m["role"] for m in first[0]["messages"]][-1] == "user"
    names = [t["function"]["name"] for t in first[0]["tools"]]
    assert len(names) == 2 and "t3" in names  # the ground truth's tool is always offered
    assert names == sorted(names, key=lambda n: int(n[1:]))  # in the record's order
    again = fc_tasks(path=str(path), first_turn_only=True, max_tools=2)
    assert again[0]["tools"] == first[0]["tools"]  # seeded: the same tools each time
    with pytest.raises(ValueError, match="max_tools"):
        fc_tasks(path=str(path), max_tools=-1)


def test_fc_tasks_min_args_and_think_args(tmp_path):
    from palaestra.egpo.fc_tasks import fc_tasks

    def row(name, args):
        call = {"function": {"name": name, "arguments": json.dumps(args)}}
        return {"messages": [{"role": "user", "content": name}, {"role": "assistant", "tool_calls": [call]}]}

    tools = [
        {"name": "none", "parameters": {"type": "object", "properties": {}}},
        {"name": "one", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}},
        {
            "name": "two",
            "parameters": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer"},
                    "y": {"type": "integer"},
                    "z": {"type": "integer", "default": 0},
                },
                "required": ["x", "y"],
            },
        },
    ]
    rows = [row("none", {}), row("one", {"a": "q"}), row("two", {"y": 2, "x": 1})]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({**r, "tools": tools}) + "\n" for r in rows))
    assert [s["messages"][-1]["content"] for s in fc_tasks(path=str(path), min_args=1)] == ["one", "two"]
    kept = fc_tasks(path=str(path), min_args=2, with_answers=True, think_args=True)
    assert len(kept) == 1
    answer = kept[0]["messages"][-1]["content"]
    # the thought names the arguments in the answer's order; the optional z (default, not given) is not named
    assert answer.startswith("<think>Call two with y, x.</think>")
    assert json.loads(answer.split("<tool_call>")[1].split("</tool_call>")[0]) == {
        "name": "two",
        "arguments": {"y": 2, "x": 1},
    }
    plain = fc_tasks(path=str(path), min_args=2, with_answers=True)
    assert plain[0]["messages"][-1]["content"].startswith("<think>Call two.</think>")
    with pytest.raises(ValueError, match="min_args"):
        fc_tasks(path=str(path), min_args=-1)
    with pytest.raises(ValueError, match="at least 3 arguments"):
        fc_tasks(path=str(path), min_args=3)


def test_entropy_demo_arms_differ_in_the_advantage_key_only():
    """entropy_demo_rl.yaml: EGPO and GRPO from entropy_demo.yaml's warm start with varied reasoning, seeds 0-2,
    one key apart."""
    sft = stage_configs(load_config(EXPERIMENTS / "entropy_demo.yaml"))["sft"]
    assert sft.sft.source == "public_fc_tasks" and sft.sft.source_kwargs["source_thoughts"] is True
    combos = {
        (c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(EXPERIMENTS / "entropy_demo_rl.yaml")
    }
    for seed in (0, 1, 2):
        egpo, grpo = combos[seed, "egpo"], combos[seed, "grpo"]
        assert egpo.seed == grpo.seed == seed
        assert [a.name for a in egpo.advantages] == ["grpo", "entropy_clipped"]
        assert [a.name for a in grpo.advantages] == ["grpo"]
        same = {k for k in vars(grpo) if getattr(grpo, k) == getattr(egpo, k)}
        assert set(vars(grpo)) - same == {"advantages", "output_dir"}
        assert egpo.tracking.experiment == grpo.tracking.experiment
        assert egpo.llm.model == sft.save_dir  # both start from the SFT model
