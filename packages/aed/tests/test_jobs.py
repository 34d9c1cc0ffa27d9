"""aed.attack end to end on Ray and MLflow (tiny budgets), aed.victim caching, and the experiment configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.shared.jobs import load_config, run_job

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["tiny_cpu", "llm_rewards", "victim_dqn", "scenarios_cpu", "paper_seeds"])
def test_experiment_configs_resolve(name):
    from palaestra.shared.matrix import file_combinations

    path = ROOT / "experiments" / "aed" / f"{name}.yaml"
    matrix = name in ("tiny_cpu", "paper_seeds")  # tiny_cpu: seeds 0, 1; paper_seeds: 0, 1, 2
    cfg = file_combinations(path)[0].cfg if matrix else load_config(path)
    assert cfg.job == {"victim_dqn": "aed.victim", "paper_seeds": "pipeline"}.get(name, "aed.attack")


@pytest.mark.parametrize("name, scenarios", [("paper", ["highway", "merge", "roundabout", "intersection"]),
                                             ("compare_cpu", ["highway"])])  # fmt: skip
def test_paper_protocol_configs(name, scenarios):
    """paper.yaml (and compare_cpu.yaml at CPU size): a qualified victim (paper: an RL victim per scenario from its
    aed.victim stage; compare_cpu: IDM, with the recipe's DQN victim trained and qualified beside it), expert and
    LLM arms on every fixed type, LLM-proposed types beside them, preference filtering, both baselines."""
    from palaestra.aed.attack import attack_tasks
    from palaestra.aed.attack_task import victim_checkpoint
    from palaestra.aed.qualify import traffic
    from palaestra.aed.rewards import SCENARIO_TYPES
    from palaestra.shared.matrix import file_combinations
    from palaestra.shared.pipeline import stage_configs

    path = ROOT / "experiments" / "aed" / f"{name}.yaml"
    combos = file_combinations(path) if name == "compare_cpu" else []  # compare_cpu: a matrix over seeds
    stages = stage_configs(combos[0].cfg if combos else load_config(path))
    attack = stages["attack"]
    assert attack.scenarios == scenarios and attack.preference.enabled
    assert attack.victim == ("idm" if name == "compare_cpu" else "rl")
    # the victim is qualified before the attack, in the attack's traffic, and the attack insists on it
    names = list(stages)
    assert names.index("qualify") < names.index("attack") and attack.require_qualified_victim
    qualify = stages["qualify"]
    assert qualify.scenarios == scenarios and traffic(qualify) == traffic(attack)
    assert qualify.victim_checkpoint == attack.victim_checkpoint and qualify.episodes >= 100
    assert attack.rewards == "both" and attack.taxonomy == "both" and attack.adversary_placement == "scenario"
    victims = {s.scenario: s for s in stages.values() if s.job == "aed.victim"}
    assert sorted(victims) == sorted(scenarios)
    rl_qualify = stages.get("qualify_rl", qualify)  # compare_cpu qualifies its RL victim in a stage of its own
    assert rl_qualify.victim == "rl" and traffic(rl_qualify) == traffic(attack)
    for scenario, v in victims.items():  # the stage's checkpoint, or the aed.victim job's default path
        default = Path(v.output_dir) / "victims" / f"{scenario}_{v.algo}.zip"
        assert Path(victim_checkpoint(rl_qualify, scenario)) == Path(v.checkpoint or default)
        assert v.algo == "dqn" and v.timesteps >= 20_000 and v.exploration_fraction == 0.1  # highway-env's recipe
        assert v.seed == 0  # one victim for every seed
    if name == "compare_cpu":  # three seeds against that one victim
        assert [c.cfg.seed for c in combos] == [0, 1, 2]
        assert {stage_configs(c.cfg)["victim"].checkpoint for c in combos} == {victims["highway"].checkpoint}
    new = [{"name": f"new_{i}", "description": "d", "recognizer": "def recognize(record):\n    return False\n"}
           for i in range(attack.proposals.n_types)]  # fmt: skip
    tasks = attack_tasks(attack, {s: new for s in scenarios}, check_victim=False)
    arms = {(t["scenario"], t["accident_type"], t["arm"]) for t in tasks if t["kind"] == "attack"}
    fixed = {
        (s, t, a) for s in scenarios for t in attack.accident_types or SCENARIO_TYPES[s] for a in ("expert", "llm")
    }
    assert arms == fixed | {(s, n["name"], "proposed") for s in scenarios for n in new}
    baselines = {(t["scenario"], t["kind"], t["arm"]) for t in tasks if t["kind"] != "attack"}
    assert baselines == {(s, k, a) for s in scenarios for k in ("random", "passive") for a in (None, "proposed")}


def test_palaestra_plan_prints_the_paper_protocols_counts(capsys):
    """`palaestra plan` (the shared CLI, through `JOB_PLANS`) prints paper.yaml's steps and CPU-hours per task,
    counted here from the config's own settings, the victim stages and the Ray placement."""
    from palaestra.aed.plan import SECONDS_PER_STEP
    from palaestra.shared.cli import main
    from palaestra.shared.pipeline import stage_configs

    path = ROOT / "experiments" / "aed" / "paper.yaml"
    stages = stage_configs(load_config(path))
    attack = stages["attack"]
    horizon = 30  # highway's policy steps per episode
    e, p = attack.eureka, attack.preference
    evaluation = attack.eval_episodes * horizon
    expert = attack.train.timesteps + evaluation + p.finetune_timesteps + evaluation + attack.video_episodes * horizon
    llm = expert + e.rounds * e.samples * (e.timesteps + e.eval_episodes * horizon)
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    hours = llm * SECONDS_PER_STEP / 3600
    assert 14 < hours < 16  # the estimate: about 15 CPU-hours per type at 50 ms per step
    assert f"| highway/rear_end/llm | {llm:,} | {hours:.2f} |" in text
    assert f"| highway/rear_end/expert | {expert:,} |" in text
    assert f"| highway/proposed_1/proposed | {llm:,} |" in text  # an LLM-proposed type: LLM arm only
    assert f"per type (all arms): highway/rear_end {(llm + expert) * SECONDS_PER_STEP / 3600:.1f} CPU-hours" in text
    # per scenario: its fixed types x 2 arms, the proposed types, random and passive for either taxonomy
    from palaestra.aed.rewards import SCENARIO_TYPES

    n = sum(2 * len(SCENARIO_TYPES[s]) + attack.proposals.n_types + 4 for s in attack.scenarios)
    assert f"Ray: {n} tasks" in text and f"each asking {attack.cpus_per_task:g} CPUs" in text and n == 52
    victims = [s for s in stages.values() if s.job == "aed.victim"]
    assert len(victims) == 4 and all(f"stage victim_{v.scenario} (aed.victim):" in text for v in victims)
    total = sum(v.timesteps for v in victims) * SECONDS_PER_STEP / 3600
    qualify = stages["qualify"]
    total += len(qualify.scenarios) * qualify.episodes * horizon * SECONDS_PER_STEP / 3600  # 30 steps everywhere
    assert f"aed.qualify highway, merge, roundabout, intersection: {qualify.episodes} passive episodes" in text
    # the LLM's requests: Eureka's per LLM-arm task (the fixed types' llm arm and the proposed types), proposals
    llm_tasks = sum(len(SCENARIO_TYPES[s]) + attack.proposals.n_types for s in attack.scenarios)
    eureka = llm_tasks * e.rounds * e.samples
    assert eureka == 1040 and f"Eureka {eureka:,} ({llm_tasks} LLM-arm tasks x {e.rounds} rounds" in text
    assert f"proposals {len(attack.scenarios) * (1 + attack.proposals.retries)}," in text
    assert f"aed.victim highway: {victims[0].timesteps:,} steps" in text
    attack_total = float(text.split("Total ")[1].split(" CPU-hours")[0])
    all_stages = float(text.split("all stages: ")[1].split(" CPU-hours")[0])
    assert all_stages == pytest.approx(attack_total + total, abs=0.1)  # "Total" is printed rounded


def test_preference_demo_attacks_the_victim_its_first_stage_caches():
    """Every seed of its matrix attacks the one victim that the first stage trains and caches."""
    from palaestra.shared.matrix import file_combinations
    from palaestra.shared.pipeline import stage_configs

    combos = file_combinations(ROOT / "experiments" / "aed" / "preference_cpu.yaml")
    assert len(combos) >= 2
    checkpoints = set()
    for combo in combos:
        stages = stage_configs(combo.cfg)
        victim, attack = stages["victim"], stages["attack"]
        assert list(stages) == ["victim", "attack"] and attack.victim == "rl" and attack.preference.enabled
        assert attack.victim_checkpoint == victim.checkpoint  # the file the victim stage writes (aed/victim.py)
        checkpoints.add(attack.victim_checkpoint)
    assert len(checkpoints) == 1


def test_bad_config_values_are_one_line_errors(tracking):
    from palaestra.shared.config import ConfigError

    base = {"job": "aed.attack", "tracking": {"enabled": False}}
    with pytest.raises(ConfigError, match="did you mean 'highway'"):
        run_job(load_config({**base, "scenarios": ["higway"]}))
    with pytest.raises(ConfigError, match="unknown accident type 'rear'"):
        run_job(load_config({**base, "accident_types": ["rear"]}))
    with pytest.raises(ConfigError, match="victim_checkpoint"):
        run_job(load_config({**base, "victim": "rl"}))


def inject_faults(monkeypatch, **faults) -> None:
    """Fault injection through the tasks (``fail_types``, ``crash_once_dir``), not through the config."""
    from palaestra.aed import attack

    plain = attack.attack_tasks
    monkeypatch.setattr(attack, "attack_tasks", lambda *a, **k: [{**t, "test_faults": faults} for t in plain(*a, **k)])


@pytest.mark.slow
def test_attack_job_end_to_end(ray_local, tracking, tmp_path, monkeypatch):
    import imageio.v2 as imageio
    from mlflow.tracking import MlflowClient

    inject_faults(monkeypatch, fail_types=["cut_in"], crash_once_dir=str(tmp_path / "markers"))
    cfg = load_config(
        {
            "job": "aed.attack",
            "scenarios": ["highway"],
            "accident_types": ["rear_end", "cut_in"],
            "env_overrides": {"vehicles_count": 6},
            "max_steps": 6,
            "train": {"timesteps": 60, "learning_starts": 20},
            "eval_episodes": 2,
            "video_episodes": 1,
            "preference": {"enabled": True, "finetune_timesteps": 20},
            "passive_baseline": True,
            "require_qualified_victim": False,
            "tracking": vars(tracking),
            "output_dir": str(tmp_path / "out"),
        }
    )
    result = run_job(cfg)
    # one type failing does not lose the others; the dead worker was retried
    assert result["aed/failed_tasks"] == 1
    assert "injected failure" in result["failures"][0]["error"] and result["failures"][0]["task"] == "highway/cut_in"
    assert (tmp_path / "markers" / "highway_rear_end.crashed").exists()
    assert 0.0 <= result["aed/highway/rear_end/asr"] <= 1.0
    assert 0.0 <= result["aed/highway/random/asr"] <= 1.0
    for key in ("distinct_types", "type_entropy", "trajectory_diversity", "steps_to_first_success", "beats_random"):
        assert f"aed/highway/{key}" in result
    for key in ("target_rate", "target_rate_lo", "random_target_rate_hi", "passive_target_rate", "beats_random_ci"):
        assert f"aed/highway/rear_end/{key}" in result

    client = MlflowClient(tracking.uri)
    parent = client.get_run(result["run_id"])
    assert "aed/highway/rear_end/responsible_rate" in parent.data.metrics
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result['run_id']}'"
    )
    by_name = {c.info.run_name: c for c in children}
    assert set(by_name) == {"highway/rear_end", "highway/cut_in", "highway/random", "highway/passive"}
    assert 0.0 <= result["aed/highway/passive/asr"] <= 1.0 and "aed/highway/passive/effective_asr_hi" in result
    rear = by_name["highway/rear_end"]
    assert rear.info.status == "FINISHED" and "aed/highway/rear_end/asr" in rear.data.metrics
    files = {f.path for f in client.list_artifacts(rear.info.run_id, "videos")}
    assert files == {"videos/highway_rear_end.gif"}
    assert {f.path for f in client.list_artifacts(rear.info.run_id, "policies")} == {
        "policies/adversary_highway_rear_end.zip"
    }
    figures = " ".join(f.path for f in client.list_artifacts(result["run_id"], "figures"))
    assert "highway_rates.png" in figures and "highway_learning_curves.png" in figures
    gif = imageio.mimread(client.download_artifacts(rear.info.run_id, "videos/highway_rear_end.gif", str(tmp_path)))
    assert len(gif) > 2 and gif[0].ndim == 3
    code = Path(client.download_artifacts(rear.info.run_id, "reward/rear_end.py", str(tmp_path))).read_text()
    assert code.startswith("def rear_end(state")
    assert "random/asr" in " ".join(by_name["highway/random"].data.metrics)


@pytest.mark.slow
def test_victim_is_trained_once_then_cached_and_drives(tracking, tmp_path):
    from palaestra.aed.env import AdversaryEnv

    cfg = load_config(
        {
            "job": "aed.victim",
            "timesteps": 40,
            "env_overrides": {"vehicles_count": 5},
            "output_dir": str(tmp_path),
            "tracking": vars(tracking),
        }
    )
    first = run_job(cfg)
    assert first["cached"] == 0 and Path(first["checkpoint"]).exists()
    assert run_job(cfg)["cached"] == 1
    env = AdversaryEnv(
        "highway",
        "rear_end",
        victim="rl",
        victim_checkpoint=first["checkpoint"],
        overrides={"vehicles_count": 5},
        max_steps=3,
    )
    env.reset(seed=0)
    speed0 = env.victim.speed
    for _ in range(3):
        *_, term, trunc, _ = env.step(1)
        if term or trunc:
            break
    assert type(env.victim).__name__ == "MDPVehicle" and env.victim_policy is not None
    assert env.victim.speed != speed0 or env.victim.crashed or env.steps == 3


@pytest.mark.slow
def test_llm_rewards_through_a_served_model_fall_back_and_go_on(ray_local, tiny_server, tracking, tmp_path):
    # the full loop over the openai backend against `palaestra serve tiny`: the random-weight model writes no valid
    # reward, so the run must say so, fall back to the expert reward and still train and evaluate the adversary
    cfg = load_config(
        {
            "job": "aed.attack",
            "accident_types": ["rear_end"],
            "env_overrides": {"vehicles_count": 6},
            "max_steps": 4,
            "rewards": "llm",
            "llm": {"backend": "openai", "model": "tiny", "base_url": tiny_server},
            "eureka": {"rounds": 2, "samples": 1, "timesteps": 20, "eval_episodes": 1, "max_tokens": 16},
            "train": {"timesteps": 30, "learning_starts": 10},
            "eval_episodes": 1,
            "random_baseline": False,
            "video": False,
            "require_qualified_victim": False,
            "tracking": vars(tracking),
            "output_dir": str(tmp_path),
        }
    )
    result = run_job(cfg)
    [res] = result["summary"]["highway"]["results"]
    assert res["reward_source"] == "expert_fallback"
    assert res["fallback_reason"].startswith("all 2 LLM reward candidates failed")
    assert 0.0 <= result["aed/highway/rear_end/asr"] <= 1.0


@pytest.mark.slow
def test_llm_proposed_types_train_on_their_llm_rewards(ray_local, tracking, tmp_path):
    # the scripted backend (no model) proposes types outside the fixed taxonomy: each runs on its LLM reward alone
    cfg = load_config(
        {
            "job": "aed.attack",
            "taxonomy": "llm",
            "proposals": {"n_types": 2},
            "llm": {"backend": "aed_scripted", "model": "scripted"},
            "env_overrides": {"vehicles_count": 6},
            "max_steps": 4,
            "eureka": {"rounds": 1, "samples": 1, "timesteps": 16, "eval_episodes": 1},
            "train": {"timesteps": 20, "learning_starts": 8},
            "eval_episodes": 2,
            "video": False,
            "require_qualified_victim": False,
            "tracking": vars(tracking),
            "output_dir": str(tmp_path),
        }
    )
    result = run_job(cfg)
    results = {r.get("accident_type", r["kind"]): r for r in result["summary"]["highway"]["results"]}
    assert set(results) == {"brake_check_rear_end", "late_cut_in", "random"}
    for name in ("brake_check_rear_end", "late_cut_in"):
        assert results[name]["reward_source"] == "llm" and f'"{name}"' in results[name]["reward_code"]
        assert results[name]["sandbox_isolation"]["audit"] is True  # logged on every run that runs LLM code
        assert f"aed/highway/{name}/target_rate_lo" in result and f"aed/highway/{name}/random_target_rate" in result
    # every accident found is named by the proposed recognizers (or 'other')
    for r in results.values():
        assert set(r["types"]) <= {"brake_check_rear_end", "late_cut_in", "other"}


def test_scenarios_cpu_covers_every_scenario_with_its_default_types():
    from palaestra.aed.attack import attack_tasks
    from palaestra.aed.rewards import SCENARIO_TYPES

    tasks = attack_tasks(load_config(ROOT / "experiments" / "aed" / "scenarios_cpu.yaml"))
    attacks = {(t["scenario"], t["accident_type"]) for t in tasks if t["kind"] == "attack"}
    assert attacks == {(s, t) for s in ("highway", "merge", "roundabout", "intersection") for t in SCENARIO_TYPES[s]}
    assert sorted(t["scenario"] for t in tasks if t["kind"] == "random") == sorted(SCENARIO_TYPES)


def test_compare_cpu_trains_each_type_on_both_rewards():
    from palaestra.aed.attack import attack_tasks
    from palaestra.shared.matrix import file_combinations
    from palaestra.shared.pipeline import stage_configs

    cfg = stage_configs(file_combinations(ROOT / "experiments" / "aed" / "compare_cpu.yaml")[0].cfg)["attack"]
    arms = sorted(
        (t["accident_type"], t["arm"]) for t in attack_tasks(cfg, check_victim=False) if t["kind"] == "attack"
    )
    assert arms == [("cut_in", "expert"), ("cut_in", "llm"), ("rear_end", "expert"), ("rear_end", "llm")]
    assert cfg.llm.backend == "aed_scripted"


@pytest.mark.parametrize("job", ["aed.attack", "aed.victim", "aed.qualify"])
def test_resolved_configs_hold_no_test_only_fields(job):
    """Fault injection lives on the tasks the tests build (inject_faults), not in what a user's config resolves to."""
    from palaestra.shared.config import to_yaml

    text = to_yaml(load_config({"job": job}))
    assert "fail_types" not in text and "crash_once_dir" not in text
    assert "scenario" in text  # the control: the dump holds the config's real fields
