"""The closed loop: edge weights steer the sampler; the student is trained per round and evaluated held out."""

from __future__ import annotations

import json
import random

import pytest

from palaestra.datagen.envs import ToolEnv, get_env
from palaestra.datagen.graph import ApiGraph, node
from palaestra.datagen.mine import is_heldout
from palaestra.datagen.sampler import sample_trace
from palaestra.shared.jobs import load_config, run_job


def _producer_share(graph, spec, target, producer, n=40) -> float:
    """Share of traces whose call right before the target is `producer` (its result feeds the target)."""
    hits = 0
    for i in range(n):
        trace, _ = sample_trace(ToolEnv(spec, i), graph, target, random.Random(i), 3)
        names = [s.name for s in trace.steps]
        if target in names and names.index(target) > 0:
            hits += names[names.index(target) - 1] == producer
    return hits / n


def test_edge_weights_steer_transitions():
    """The closed loop raises the weight of edges the student fails on; the sampler then walks them more often
    (here: which of get_ticket's two producers feeds it)."""
    spec = get_env("TicketAPI")
    graph = ApiGraph()
    graph.add_env(spec, probe=False)
    target, producer = "get_ticket", "get_user_tickets"
    producers = {u.split(".")[1] for u, _ in graph.g.in_edges(node("TicketAPI", target))}
    assert {producer, "create_ticket"} <= producers, producers
    base = _producer_share(graph, spec, target, producer)
    graph.g.edges[node("TicketAPI", producer), node("TicketAPI", target)]["weight"] = 60.0
    boosted = _producer_share(graph, spec, target, producer)
    assert boosted >= 0.5 and boosted >= 1.5 * base, (base, boosted)


def test_heldout_split_is_stable_and_sized():
    ids = [f"run-s0-r0-{i}" for i in range(2000)]
    held = [i for i in ids if is_heldout(i, 0.25)]
    assert held == [i for i in ids if is_heldout(i, 0.25)]
    assert 0.22 < len(held) / len(ids) < 0.28


@pytest.mark.slow
def test_two_rounds_train_the_student_and_log_per_round(tmp_path, tracking, monkeypatch):
    """mine with the tiny student: 2 rounds, SFT changes its weights each round, metrics per round."""
    from mlflow.tracking import MlflowClient

    import palaestra.shared.rl.sft as sft

    changed = []
    real = sft.run_sft

    def recording_run_sft(model, tokenizer, opts, **kw):
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        out = real(model, tokenizer, opts, **kw)
        changed.append(any(not (before[k] == v).all() for k, v in model.named_parameters()))
        with open(opts.data_path) as f:
            rows = [json.loads(line) for line in f]
        assert rows and all(r["messages"][0]["role"] == "system" and isinstance(r["tools"], list) for r in rows)
        return out

    monkeypatch.setattr(sft, "run_sft", recording_run_sft)
    cfg = load_config(
        {
            "job": "datagen.mine",
            "name": "loop",
            "rounds": 2,
            "num_samples": 6,
            "workers": 0,
            "envs": ["TicketAPI"],  # nine tools: the shortest prompts
            "heldout_fraction": 0.34,
            "student": "llm",
            "student_llm": {"backend": "transformers", "model": "tiny", "device": "cpu"},
            "student_sampling": {"temperature": 0.0, "max_tokens": 8},
            "student_sft": {"steps": 2, "batch_size": 1, "lr": 0.01, "max_length": 8192},
            "item": {"max_turns": 1, "max_steps": 2, "p_miss_param": 0.0, "p_miss_func": 0.0},
            "output_dir": str(tmp_path),
        }
    )
    cfg.tracking = tracking
    result = run_job(cfg)
    assert changed == [True, True]
    client = MlflowClient(tracking.uri)
    for key in (
        "mine/student_failure_rate",
        "mine/heldout_failure_rate_before",
        "mine/heldout_failure_rate_after",
        "mine/sft_loss_first",
        "mine/sft_loss_last",
    ):
        assert [m.step for m in client.get_metric_history(result["run_id"], key)] == [0, 1], key
    rounds = json.loads((tmp_path / "datagen" / "loop" / "rounds.json").read_text())
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        assert r["heldout_samples"] + r["mining_samples"] == r["kept"]
