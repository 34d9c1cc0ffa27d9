"""The end-of-run table: one line per stage (job, headline with interval, artifacts) and the MLflow UI command."""

from dataclasses import dataclass
from pathlib import Path

from palaestra.shared import cli
from palaestra.shared.config import JobConfig
from palaestra.shared.jobs import format_headline, job
from palaestra.shared.stats import wilson_interval


@dataclass
class CoinConfig(JobConfig):
    heads: int = 7
    flips: int = 10


@job("test.coin", CoinConfig)
def coin(cfg, tracker):
    """Reports a rate with its Wilson interval as its headline."""
    lo, hi = wilson_interval(cfg.heads, cfg.flips)
    return {"rate": cfg.heads / cfg.flips, "headline": format_headline("heads", cfg.heads / cfg.flips, (lo, hi))}


@job("test.silent", JobConfig)
def silent(cfg, tracker):
    """Gives no headline."""
    return {"x": 1.0}


def test_format_headline():
    assert (
        format_headline("win rate", 0.4449, (0.41, 0.4701), "95% Wilson") == "win rate 0.44 [0.41, 0.47] (95% Wilson)"
    )
    assert format_headline("tokens/s", 1234.4) == "tokens/s 1234"
    assert format_headline("loss", 0.5) == "loss 0.50"


def test_pipeline_ends_with_one_line_per_stage(tmp_path, tracking, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "job: pipeline\n"
        f"tracking: {{experiment: t, uri: '{tracking.uri}', artifact_root: '{tracking.artifact_root}'}}\n"
        "stages:\n  coin: {job: test.coin, heads: 3, flips: 4}\n  quiet: {job: test.silent}\n"
    )
    assert cli.main(["run", str(cfg)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("\nstage") + 1 :].splitlines()
    assert table[0].split() == ["stage", "job", "headline", "artifacts"]
    lo, hi = 0.3006, 0.9544  # Wilson 95% for 3/4 (closed form, z=1.96)
    coin_row, quiet_row = table[1], table[2]
    assert coin_row.startswith("coin") and "test.coin" in coin_row
    assert f"heads 0.75 [{lo:.2f}, {hi:.2f}]" in coin_row
    assert quiet_row.split()[:3] == ["quiet", "test.silent", "-"]
    for row in (coin_row, quiet_row):  # the artifacts column is the stage's MLflow artifact directory
        assert (Path(row.split()[-1]) / "config.yaml").is_file()
    assert table[3].startswith("MLflow UI: ") and f"ui --workers 1 --backend-store-uri {tracking.uri}" in table[3]
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(tracking.uri).search_runs(
        [MlflowClient(tracking.uri).get_experiment_by_name("t").experiment_id], "tags.mlflow.runName = 'coin'"
    )
    assert runs[0].data.tags["palaestra.headline"].startswith("heads 0.75 [")


def test_rl_train_headline():
    from palaestra.shared.rl.train import train_headline

    summary = {
        "eval_before_reward_mean": 0.30,
        "eval_before_reward_ci95": 0.08,
        "eval_after_reward_mean": 0.95,
        "eval_after_reward_ci95": 0.04,
        "eval_after_trajectories": 128,
    }
    line = train_headline(summary)
    assert line.startswith("eval reward 0.95 [0.91, 0.99] (before training 0.30 [0.22, 0.38]; 128 trajectories")
    assert train_headline({"reward_first": 0.03, "reward_last": 0.09}).startswith("train reward 0.09 (first step 0.03")
