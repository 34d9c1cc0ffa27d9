"""egpo.train through the shared trainer, and the experiment configs."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from palaestra.shared.config import read_yaml
from palaestra.shared.jobs import _stage_config, load_config, run_job, stage_configs

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "egpo"


def test_configs_resolve():
    tiny = load_config(EXPERIMENTS / "tiny_cpu.yaml")
    assert [a.name for a in tiny.advantages] == ["grpo", "entropy_clipped"]
    paper = load_config(EXPERIMENTS / "qwen3_4b_bfcl.yaml")
    assert paper.llm.model == "Qwen/Qwen3-4B-Instruct-2507" and paper.workers.llm.backend == "vllm"
    assert paper.optim.lr == 1e-6 and paper.rollout.temperature == 0.7 and paper.loss.kl_coef == 0.001
    assert paper.rollout.max_tokens_per_turn == 8192
    assert paper.advantages[1].options == {"lam": 0.4, "alpha": 2.0}


def test_ablation_stages_differ_in_the_advantage_key_only():
    pipeline = load_config(EXPERIMENTS / "ablation.yaml")
    grpo, egpo = (_stage_config(pipeline, name, pipeline.stages[name]) for name in ("grpo", "egpo"))
    assert [a.name for a in grpo.advantages] == ["grpo"]
    assert [a.name for a in egpo.advantages] == ["grpo", "entropy_clipped"]
    same = {k for k in vars(grpo) if getattr(grpo, k) == getattr(egpo, k)}
    assert set(vars(grpo)) - same == {"advantages", "output_dir", "tracking"}
    assert read_yaml(EXPERIMENTS / "ablation.yaml")["job"] == "pipeline"


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
    pipeline = load_config(EXPERIMENTS / "smollm2_cpu.yaml")
    grpo, egpo = (_stage_config(pipeline, name, pipeline.stages[name]) for name in ("grpo", "egpo"))
    same = {k for k in vars(grpo) if getattr(grpo, k) == getattr(egpo, k)}
    assert set(vars(grpo)) - same == {"advantages", "output_dir", "tracking"}
    sft = _stage_config(pipeline, "sft", pipeline.stages["sft"])
    # RL starts from the model the SFT stage writes; every evaluation sees the same entries
    assert egpo.llm.model == sft.save_dir
    evals = [_stage_config(pipeline, n, pipeline.stages[n]) for n in ("baseline", "sft_eval")]
    assert all(e.categories == list(egpo.eval.categories) and e.limits == dict(egpo.eval.limits) for e in evals)
    # revision 8: three seeds per arm, each pair one key apart, every arm from the same SFT model
    for seed in (0, 1, 2):
        g8, e8 = (
            _stage_config(pipeline, n, pipeline.stages[n]) for n in (f"grpo_r8_seed{seed}", f"egpo_r8_seed{seed}")
        )
        assert {k for k in vars(g8) if getattr(g8, k) != getattr(e8, k)} == {"advantages", "output_dir", "tracking"}
        assert g8.seed == seed and e8.llm.model == sft.save_dir and list(e8.eval.categories) == evals[0].categories
        assert [a.name for a in e8.advantages] == ["grpo", "entropy_clipped"]
        assert [a.name for a in g8.advantages] == ["grpo"]
    # multi_turn_base: the baseline and the SFT model under the same evaluation settings
    base_mt, sft_mt = (_stage_config(pipeline, n, pipeline.stages[n]) for n in ("baseline_mt", "sft_eval_mt"))
    assert {k for k in vars(base_mt) if getattr(base_mt, k) != getattr(sft_mt, k)} == {"llm", "output_dir", "tracking"}
    assert base_mt.categories == ["multi_turn_base"] and sft_mt.llm.model == sft.save_dir
    # revision 9: each seed-0 arm's final checkpoint (the trainer's layout) under the same multi-turn settings
    for arm in ("egpo", "grpo"):
        mt = _stage_config(pipeline, f"{arm}_mt_seed0", pipeline.stages[f"{arm}_mt_seed0"])
        trained = _stage_config(pipeline, f"{arm}_r8_seed0", pipeline.stages[f"{arm}_r8_seed0"])
        assert mt.llm.model == f"{trained.output_dir}/checkpoints/step_{trained.steps:06d}"
        assert {k for k in vars(base_mt) if getattr(base_mt, k) != getattr(mt, k)} == {"llm", "output_dir", "tracking"}
    # the default run is the current protocol: every model of the README table, each on the same four categories
    protocol = stage_configs(pipeline)
    assert list(protocol) == list(pipeline.only) and "egpo" not in protocol  # revision 5-7 arms only on request
    scored = {
        n: set(s.categories if s.job == "egpo.eval" else s.eval.categories)
        for n, s in protocol.items()
        if s.job in ("egpo.eval", "egpo.train")
    }
    assert set().union(*scored.values()) == {"simple_python", "multiple", "parallel", "multi_turn_base"}


def test_fc_tasks_max_tools_and_first_turn_only(tmp_path):
    from palaestra.egpo.train import fc_tasks

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
    from palaestra.egpo.train import fc_tasks

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
    """entropy_demo.yaml: EGPO and GRPO from one warm start with varied reasoning, seeds 0-2, one key apart."""
    pipeline = load_config(EXPERIMENTS / "entropy_demo.yaml")
    sft = _stage_config(pipeline, "sft", pipeline.stages["sft"])
    assert sft.sft.source == "public_fc_tasks" and sft.sft.source_kwargs["source_thoughts"] is True
    for seed in (0, 1, 2):
        egpo, grpo = (
            _stage_config(pipeline, f"{a}_seed{seed}", pipeline.stages[f"{a}_seed{seed}"]) for a in ("egpo", "grpo")
        )
        assert egpo.seed == grpo.seed == seed
        assert [a.name for a in egpo.advantages] == ["grpo", "entropy_clipped"]
        assert [a.name for a in grpo.advantages] == ["grpo"]
        same = {k for k in vars(grpo) if getattr(grpo, k) == getattr(egpo, k)}
        assert set(vars(grpo)) - same == {"advantages", "output_dir", "tracking"}  # tracking: the run's name
        assert egpo.tracking.experiment == grpo.tracking.experiment
        assert egpo.llm.model == sft.save_dir  # both start from the SFT model
