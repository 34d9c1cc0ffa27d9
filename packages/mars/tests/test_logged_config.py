"""What ran is what is logged: mars.train resolves its env mixture and its warm-start source in the config (before
MLflow logs it), not in the job; the logged YAML resolves to itself."""

from __future__ import annotations

import yaml

from palaestra.shared.config import to_yaml
from palaestra.shared.jobs import load_config


def test_envs_and_warm_start_source_are_in_the_logged_config():
    cfg = load_config({"job": "mars.train"}, ["games=[{game: kuhn_poker}]", "mode=versus", "sft_warmup.steps=3"])
    logged = yaml.safe_load(to_yaml(cfg))
    assert [(e["name"], e["kwargs"]["game"], e["kwargs"]["opponent"]) for e in logged["envs"]] == [
        ("mars_versus", "kuhn_poker", "random")
    ]
    assert logged["sft_warmup"]["source"] == "mars_legal_moves"
    assert logged["sft_warmup"]["source_kwargs"] == {"games": ["kuhn_poker"], "prompt": "full"}
    again = load_config(logged)
    assert to_yaml(again) == to_yaml(cfg)  # a fixed point: re-running the logged config runs the same


def test_an_explicit_env_list_and_warm_start_source_are_kept():
    envs = "envs=[{name: mars_game, kwargs: {game: tic_tac_toe}}]"
    cfg = load_config({"job": "mars.train"}, [envs, "sft_warmup.steps=3", "sft_warmup.data_path=x.jsonl"])
    assert [e.kwargs for e in cfg.envs] == [{"game": "tic_tac_toe"}]
    assert cfg.sft_warmup.source is None
