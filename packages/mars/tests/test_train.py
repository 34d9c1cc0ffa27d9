"""mars.train: configs resolve, env specs follow the mixture, a tiny end-to-end run through the shared trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.mars.train import GameWeight, MarsTrainConfig, game_env_specs
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.matrix import file_combinations
from palaestra.shared.rollout.env import ENVS

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "mars"


@pytest.mark.parametrize(
    "name",
    [
        "tiny_cpu.yaml",
        "qwen3_4b.yaml",
        "quickstart.yaml",
        "mas.yaml",
        "tiny_cpu_vs_mcts.yaml",
    ],
)
def test_experiment_configs_resolve(name):
    cfg = load_config(EXPERIMENTS / name)
    if name == "qwen3_4b.yaml":  # the paper's settings
        assert cfg.llm.model == "Qwen/Qwen3-4B" and cfg.workers.llm.backend == "vllm"
        assert [g.game for g in cfg.games] == ["tic_tac_toe", "kuhn_poker", "mini_hanabi"]
        assert cfg.loss.epsilon == 0.2 and cfg.loss.dual_clip and cfg.loss.kl_coef == 0.2
        assert cfg.optim.lr == 1e-6 and cfg.steps == 200
        assert cfg.tasks_per_step * cfg.rollout.group_size * 2 == 384  # two seats per self-play episode
        assert [a.name for a in cfg.advantages] == ["mars_code_norm"]  # MARS's code path (test_marss_code.py)
        # MARS's code: dual clip 1 + 2ε (base_worker.py), agg_loss seq-mean-token-sum, sampling T 0.6 / top_p 0.99
        assert cfg.loss.dual_clip == pytest.approx(1 + 2 * cfg.loss.epsilon)
        assert cfg.loss.reduction == "seq-mean-token-sum"
        assert cfg.rollout.temperature == 0.6 and cfg.rollout.top_p == 0.99 and cfg.rollout.top_k == 100
        assert cfg.rollout.response_prefix == "<think>\n"  # MARS's forced start of the response
        assert cfg.shaping.truncated_is_format_loss and cfg.shaping.length_penalty == 0.5
        assert (cfg.shaping.length_min, cfg.shaping.length_max) == (11, 2048)
        # MARS's overlong_sequence: <= 1,000 of its sequence_length 32,768 left is a format loss
        assert (cfg.shaping.sequence_length, cfg.shaping.sequence_margin) == (32768, 1000)
        assert cfg.rollout.max_context_tokens == cfg.shaping.sequence_length
        # MARS's optimizer (agentic_val_*_selfplay.yaml): betas (0.9, 0.95), wd 0.05, 10 warmup steps, cosine
        assert list(cfg.optim.betas) == [0.9, 0.95] and cfg.optim.weight_decay == 0.05
        assert cfg.optim.warmup_steps == 10 and cfg.optim.schedule == "cosine" and cfg.optim.min_lr == 0.0
    if name == "tiny_cpu_vs_mcts.yaml":  # tiny_cpu.yaml's final checkpoint against MCTS with MARS's settings
        trained = load_config(EXPERIMENTS / "tiny_cpu.yaml")
        assert cfg.llm.model == f"{trained.output_dir}/checkpoints/step_{trained.steps:06d}"
        assert (cfg.mcts_simulations, cfg.mcts_uct_c, cfg.mcts_rollouts, cfg.mcts_solve) == (100, 2.0, 10, False)
        assert cfg.prompt == trained.prompt and cfg.temperature == trained.eval.temperature
    if name == "quickstart.yaml":
        from palaestra.shared.pipeline import stage_configs

        stages = stage_configs(cfg)
        assert stages["mars_selfplay"].job == "mars.train"
        assert stages["mars_eval"].opponents == ["random", "equilibrium"]
        assert stages["mars_selfplay"].games[0].game == "kuhn_poker"


def test_env_specs_follow_the_mixture_and_build():
    cfg = MarsTrainConfig()
    specs = game_env_specs(cfg)
    assert [s.kwargs["game"] for s in specs] == ["tic_tac_toe", "kuhn_poker", "mini_hanabi"]
    env = ENVS.get(specs[1].name)(**specs[1].kwargs)
    env.reset(0)
    assert env.agents == ["player_0", "player_1"] and env.env_type == "kuhn_poker"
    cfg.mode = "versus"
    cfg.opponent = "mcts"
    versus = ENVS.get(game_env_specs(cfg)[0].name)(**game_env_specs(cfg)[0].kwargs)
    versus.reset(1)
    assert versus.agents == ["player_1"]
    with pytest.raises(ConfigError, match="unknown mode"):
        game_env_specs(MarsTrainConfig(mode="league"))
    with pytest.raises(ConfigError, match="known games"):
        game_env_specs(MarsTrainConfig(games=[GameWeight("go")]))


@pytest.mark.slow
def test_tiny_selfplay_run_end_to_end(tracking, tmp_path):
    import mlflow

    cfg = load_config(
        EXPERIMENTS / "tiny_cpu.yaml",
        [
            f"output_dir={tmp_path}",
            "sft_warmup.steps=2",
            "sft_warmup.source_kwargs.episodes=4",
            "steps=1",
            "tasks_per_step=2",
            "eval.episodes=3",
            f"tracking.uri={tracking.uri}",
            f"tracking.artifact_root={tracking.artifact_root}",
            "tracking.experiment=test",
        ],
    )
    out = run_job(cfg)
    assert out["steps"] == 1
    metrics = mlflow.tracking.MlflowClient(tracking.uri).get_run(out["run_id"]).data.metrics
    assert "train/reward_mean" in metrics and "eval/tic_tac_toe/first/random/win_rate" in metrics
    for when in ("start", "end"):
        assert f"{when}/eval/tic_tac_toe/second/random/win_rate" in out
    assert (tmp_path / "checkpoints").is_dir()


def test_choice_fields_are_enums_checked_when_the_config_resolves():
    for key, typo, right in (("mode", "selfpaly", "selfplay"), ("seat", "frist", "first"), ("prompt", "ful", "full")):
        with pytest.raises(ConfigError, match=f"did you mean '{right}'"):
            load_config({"job": "mars.train", key: typo})
    with pytest.raises(ConfigError, match="did you mean 'mcts'"):
        load_config({"job": "mars.eval", "opponents": ["random", "mtcs"]})
    with pytest.raises(ConfigError, match="did you mean 'group_chat'"):
        load_config({"job": "mars.mas", "systems": ["group_chta"]})


def test_kuhn_control_is_the_rl_run_with_its_rl_steps_given_to_sft():
    """kuhn_cpu.yaml's control arm differs from its RL arm only in where it writes and in replacing the RL steps
    by as many further SFT steps: the same seeds, warm-start data, prompts and evaluation; one `seed` sets the
    tiny initialization, the SFT data and the SFT order."""
    from palaestra.shared.config import flatten

    combos = {
        (c.values["seed"], c.values["arm"]): flatten(c.cfg) for c in file_combinations(EXPERIMENTS / "kuhn_cpu.yaml")
    }
    assert set(combos) == {(s, a) for s in (0, 1, 2) for a in ("rl", "control")}
    for s in (0, 1, 2):
        rl, control = combos[s, "rl"], combos[s, "control"]
        differ = {k for k in set(rl) | set(control) if rl.get(k) != control.get(k)}
        assert differ == {"steps", "output_dir", "sft_warmup.steps"}
        assert control["steps"] == 0 and control["sft_warmup.steps"] == rl["sft_warmup.steps"] + rl["steps"]
        seeds = ("seed", "llm.seed", "sft_warmup.seed", "sft_warmup.source_kwargs.seed")
        assert [rl[k] for k in seeds] == [s] * 4


def test_mars_ablation_arms_differ_in_the_advantage_pipeline_only():
    """ablation.yaml: tiny_cpu.yaml's arms with group_size 4, one key apart."""
    arms = {c.values["arm"]: c.cfg for c in file_combinations(EXPERIMENTS / "ablation.yaml")}
    pipelines = {k: [a.name for a in s.advantages] for k, s in arms.items()}
    assert pipelines["grpo"] == ["grpo"] and pipelines["mars"] == ["turn_level", "agent_norm"]
    dump = lambda s: {k: v for k, v in vars(s).items() if k not in ("advantages", "output_dir")}  # noqa: E731
    first = dump(arms["mars"])
    assert all(dump(s) == first for s in arms.values()) and first["rollout"].group_size == 4


@pytest.mark.slow
def test_first_finished_batch_trains_on_the_first_rows(tracking, tmp_path, monkeypatch):
    """`batch.rule: first_finished` through the job: 2 environments per game, ceil(8 / 4) = 2 episodes each (8
    episodes, 16 rows played), and the step trains on the first 2 x tasks_per_step = 8 rows."""
    import mlflow

    from palaestra.mars.batching import FirstFinished

    calls = []
    select = FirstFinished.select

    def recording_select(self, step, played):  # the shared trainer's batch rule hook (evaluations skip it)
        result = select(self, step, played)
        calls.append((len(self.draw(step)), result.stats["played_trajectories"], len(result.trajectories)))
        return result

    monkeypatch.setattr(FirstFinished, "select", recording_select)

    cfg = load_config(
        {
            "job": "mars.train",
            "llm": {"model": "tiny"},
            "output_dir": str(tmp_path),
            "games": [{"game": "kuhn_poker"}, {"game": "tic_tac_toe"}],
            "prompt": "minimal",
            "batch": {"rule": "first_finished", "env_slots": [2, 2], "clock": "turns"},
            "rollout": {"max_tokens_per_turn": 8, "max_context_tokens": 512},
            "shaping": {"require_think": False},
            "steps": 1,
            "tasks_per_step": 4,
            "eval": {"games": ["kuhn_poker"], "opponents": ["random"], "episodes": 1, "max_tokens_per_turn": 8},
            "tracking": {"uri": tracking.uri, "artifact_root": tracking.artifact_root, "experiment": "test"},
        }
    )
    out = run_job(cfg)
    metrics = mlflow.tracking.MlflowClient(tracking.uri).get_run(out["run_id"]).data.metrics
    assert metrics["rollout/trajectories"] == 8
    assert calls == [(8, 16, 8)]
    # MARS's table of the step-0 model against the trained one, as an artifact
    client = mlflow.tracking.MlflowClient(tracking.uri)
    table = (Path(client.download_artifacts(out["run_id"], "eval_table.md"))).read_text()
    assert table.startswith("| game | seat | opponent | base | trained | relative change |")
    assert "| kuhn_poker | both | random |" in table


def test_kuhn_ablation_arms_differ_in_the_estimator_only():
    """kuhn_ablation.yaml: per seed, four RL arms that are kuhn_cpu.yaml's RL arm of that seed with 8 deals x 4
    plays and their own advantage pipeline, and the control that is kuhn_cpu.yaml's control of that seed."""
    from dataclasses import asdict

    arms = {(c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(EXPERIMENTS / "kuhn_ablation.yaml")}
    kuhn = EXPERIMENTS / "kuhn_cpu.yaml"
    base = {(c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(kuhn)}
    plays = ["rollout.group_size=4", "tasks_per_step=8"]
    four = {(c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(kuhn, overrides=plays)}
    estimators = {
        "grpo": ["grpo"],
        "turn": ["turn_level"],
        "turn_norm": ["turn_level", "agent_norm"],
        "mars_code": ["mars_code_norm"],
    }
    assert set(arms) == {(s, a) for a in [*estimators, "control"] for s in range(3)}
    skip = ("advantages", "output_dir", "tracking", "envs")
    for s in range(3):
        rl = asdict(four[s, "rl"])
        for arm, names in estimators.items():
            assert [a.name for a in arms[s, arm].advantages] == names
            assert {k: v for k, v in asdict(arms[s, arm]).items() if k not in skip} == {
                k: v for k, v in rl.items() if k not in skip
            }
        assert {k: v for k, v in asdict(arms[s, "control"]).items() if k not in skip} == {
            k: v for k, v in asdict(base[s, "control"]).items() if k not in skip
        }
