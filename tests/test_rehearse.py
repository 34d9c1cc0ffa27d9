"""`palaestra rehearse` on the four paper configs: each completes, drops no episode, logs the metrics the paper run
logs, and what it wrote reloads.

The metric keys each paper run logs are written here from the paper configs and the papers' protocols (BFCL's
categories and summaries; MARS's games against MCTS in both seats, the poker games against an equilibrium,
Hanabi in self-play; AED's attack success and responsibility rates per scenario and type; datagen's kept and
dropped counts), not read from a run. Where vLLM is importable (``.venv-vllm``) the RL rehearsals run their
rollout workers on vLLM; the tests marked ``vllm`` assert that they did.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml

from palaestra.shared.rehearse import RehearsalResult, rehearse

ROOT = Path(__file__).resolve().parents[1]
EGPO = ROOT / "experiments" / "egpo" / "qwen3_4b_bfcl.yaml"
MARS = ROOT / "experiments" / "mars" / "qwen3_4b.yaml"
AED = ROOT / "experiments" / "aed" / "paper.yaml"
DATAGEN = ROOT / "experiments" / "datagen" / "llm_served.yaml"
TRAINER_KEYS = [
    "train/loss",
    "train/kl",
    "train/entropy",
    "train/grad_norm",
    "train/clip_fraction",
    "train/reward_mean",
    "train/lr",
    "rollout/trajectories",
    "rollout/failed_episodes",
]


@pytest.fixture(autouse=True)
def own_ray_instance():
    """Each rehearsal starts its own Ray instance (``cluster.num_cpus`` 4: two learner ranks beside the rollout
    workers); the 2-CPU instance earlier tests leave could not place its rollout worker. Put that one back after."""
    ray = pytest.importorskip("ray")
    from palaestra.shared import cluster
    from palaestra.shared.testing import TEST_CLUSTER

    was_up = ray.is_initialized()
    ray.shutdown()
    yield
    ray.shutdown()
    if was_up:
        cluster.init(TEST_CLUSTER)


def metrics(result: RehearsalResult) -> dict[str, list[float]]:
    """Every metric of the rehearsal's MLflow store (all its runs): key -> values."""
    db = Path(result.config.tracking.uri.removeprefix("sqlite:///"))
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT key, value FROM metrics").fetchall()
    out: dict[str, list[float]] = {}
    for key, value in rows:
        out.setdefault(key, []).append(value)
    return out


def assert_logged(logged: dict[str, list[float]], expected: list[str]) -> None:
    missing = sorted(set(expected) - set(logged))
    assert not missing, f"{len(missing)} metrics the paper run logs are missing, e.g. {missing[:5]}"


def assert_no_dropped_episode(logged: dict[str, list[float]]) -> None:
    assert logged.get("rollout/failed_episodes"), "rollout/failed_episodes was never logged"
    assert all(v == 0 for v in logged["rollout/failed_episodes"]), logged["rollout/failed_episodes"]


def scaled_value(result: RehearsalResult, key: str) -> str:
    return next(r for k, _, r in result.table if k == key)


def egpo_keys(paper: dict) -> list[str]:
    keys = list(TRAINER_KEYS)
    if any(step["name"] == "entropy_clipped" for step in paper["advantages"]):
        keys += ["adv/entropy_changed_share", "adv/entropy_bonus_ratio"]
    keys += [f"bfcl/{category}/accuracy" for category in paper["eval"]["categories"]]
    # every training set through BFCL's contamination check before training (egpo.train's log_contamination)
    keys += [f"data/envs.{i}.{env['name']}/contaminated" for i, env in enumerate(paper["envs"])]
    return keys + ["bfcl/summary/overall", "bfcl/summary_v3/overall", "bfcl/summary_v3/multi_turn"]


def mars_keys(paper: dict, levels: list[int]) -> list[str]:
    """MARS's protocol: board games vs MCTS at each level in each seat, poker vs an equilibrium, Hanabi self-play."""
    keys = list(TRAINER_KEYS)
    for game in paper["eval"]["games"]:
        if game in ("tic_tac_toe", "connect_four"):
            opponents = [f"mcts{level}" for level in levels]
        elif game in ("kuhn_poker", "leduc_poker"):
            opponents = ["equilibrium"]
        else:
            keys.append(f"eval/{game}/selfplay/self/mean_return")
            continue
        for seat in paper["eval"]["seats"]:
            keys += [f"eval/{game}/{seat}/{opponent}/win_rate" for opponent in opponents]
            keys += [f"eval/{game}/{seat}/{opponent}/format_loss_rate" for opponent in opponents]
    return keys


def run_egpo(tmp_path: Path) -> RehearsalResult:
    result = rehearse(EGPO, tmp_path / "egpo")
    logged = metrics(result)
    assert_logged(logged, egpo_keys(yaml.safe_load(EGPO.read_text())))
    assert_no_dropped_episode(logged)
    assert result.checks and "reloaded" in result.checks[0]
    # sizes changed, the protocol kept
    kept = {k for k, _, _ in result.table} - set(result.scaled)
    assert {"advantages.1.options.lam", "loss.kl_coef", "eval.prompt", "eval.decoder", "learner.strategy"} <= kept
    assert scaled_value(result, "learner.world_size") == "2"
    return result


def run_mars(tmp_path: Path) -> RehearsalResult:
    result = rehearse(MARS, tmp_path / "mars")
    logged = metrics(result)
    levels = yaml.safe_load(scaled_value(result, "eval.mcts_levels"))
    assert len(levels) == len(yaml.safe_load(MARS.read_text())["eval"]["mcts_levels"])
    assert_logged(logged, mars_keys(yaml.safe_load(MARS.read_text()), levels))
    assert_no_dropped_episode(logged)
    assert result.checks and "reloaded" in result.checks[0]
    kept = {k for k, _, _ in result.table} - set(result.scaled)
    assert {"rollout.response_prefix", "shaping.format_penalty", "loss.dual_clip", "batch.rule", "mode"} <= kept
    return result


@pytest.mark.slow
def test_egpo_paper_config_rehearses(tmp_path):
    run_egpo(tmp_path)


@pytest.mark.slow
def test_mars_paper_config_rehearses(tmp_path):
    run_mars(tmp_path)


@pytest.mark.slow
@pytest.mark.vllm
def test_egpo_rehearsal_rolls_out_on_vllm(tmp_path):
    result = run_egpo(tmp_path)
    assert result.config.workers.llm.backend == "vllm"
    assert result.config.workers.weight_sync == yaml.safe_load(EGPO.read_text())["workers"].get(
        "weight_sync", "object_store"
    )


@pytest.mark.slow
@pytest.mark.vllm
def test_mars_rehearsal_rolls_out_on_vllm(tmp_path):
    assert run_mars(tmp_path).config.workers.llm.backend == "vllm"


@pytest.mark.slow
def test_aed_paper_config_rehearses(tmp_path):
    from palaestra.shared.pipeline import stage_configs

    result = rehearse(AED, tmp_path / "aed")
    paper = yaml.safe_load(AED.read_text())
    attack = stage_configs(result.config)["attack"]
    logged = metrics(result)
    victims = [name for name, stage in paper["stages"].items() if stage["job"] == "aed.victim"]
    assert len(result.checks) == len(victims) + 1 and all("reloaded" in line for line in result.checks)
    assert len(logged["victim/return_last10"]) == len(victims)
    # AED's metrics (attack success, AV-responsible rate, diversity) per scenario, for both reward arms
    (accident_type,) = attack.accident_types
    expected = []
    assert set(attack.scenarios) <= set(paper["stages"]["attack"]["scenarios"])
    for scenario in attack.scenarios:
        for arm in ("expert", "llm"):
            expected += [f"aed/{scenario}/{accident_type}/{arm}/{key}" for key in ("asr", "responsible_rate")]
        expected += [f"aed/{scenario}/distinct_types", f"aed/{scenario}/type_entropy"]
    assert_logged(logged, expected)
    assert logged["result/attack/aed/failed_tasks"] == [0.0]  # no task lost
    kept = {k for k, _, _ in result.table} - set(result.scaled)
    assert {"stages.attack.rewards", "stages.attack.taxonomy", "stages.attack.preference.judge"} <= kept
    assert {"stages.attack.victim", "stages.attack.adversary_placement", "stages.attack.train.algo"} <= kept


@pytest.mark.slow
def test_served_datagen_paper_config_rehearses(tmp_path):
    result = rehearse(DATAGEN, tmp_path / "datagen")
    logged = metrics(result)
    assert_logged(logged, ["stats/kept", "stats/dropped", "stats/llm_calls", "progress/kept", "result/kept"])
    assert sum(logged["stats/llm_calls"]) > 0  # the roles called the local server
    assert result.config.roles.llm.base_url.startswith("http://127.0.0.1:")
    assert result.checks and "reread" in result.checks[0]
