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
    (here: which of get_tweet's read-only producers feeds it; TicketAPI's create_ticket, the other producer of
    get_ticket, is refused as a hidden state change since issue 39, so it no longer competes)."""
    spec = get_env("TwitterAPI")
    graph = ApiGraph()
    graph.add_env(spec, probe=False)
    target, producer = "get_tweet", "get_user_tweets"
    producers = {u.split(".")[1] for u, _ in graph.g.in_edges(node("TwitterAPI", target))}
    assert {producer, "search_tweets"} <= producers, producers
    base = _producer_share(graph, spec, target, producer)
    graph.g.edges[node("TwitterAPI", producer), node("TwitterAPI", target)]["weight"] = 60.0
    boosted = _producer_share(graph, spec, target, producer)
    assert boosted >= 0.4 and boosted >= 2 * base, (base, boosted)  # 0.175 -> 0.475 at 40 traces


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


CONTEXT_ERROR = "prompt 0 has 4324 tokens; the model's context is 4096 tokens (tiny)"  # TransformersClient's words


class FixedContextClient:
    """A student backend with a context of `limit` characters: a longer prompt fails as the backends fail it
    (an `LLMError` naming the context), a shorter one gets `answer`; `error` replaces every answer by that
    failure (a server that is down)."""

    def __init__(self, limit: int, answer: str = "I cannot do that.", error: str | None = None):
        self.limit, self.answer, self.error = limit, answer, error
        self.requests = 0

    def chat(self, conversations, params, tools=None):
        from palaestra.shared.llm.base import Completion, LLMError

        self.requests += 1
        if self.error:
            raise LLMError(self.error)
        size = sum(len(m.get("content") or "") for m in conversations[0]) + len(json.dumps(tools or []))
        if size > self.limit:
            raise LLMError(CONTEXT_ERROR)
        return [Completion(self.answer, [1], None, [1], "stop")]


@pytest.fixture(scope="module")
def math_rows(tmp_path_factory):
    """MathAPI rows (17 tools, about 4,300 of tiny's tokens with the reasoner's prompt), one in three with a
    miss_func turn (an empty answer to it is a correct refusal)."""
    from palaestra.datagen.dataset import read_rows
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.tracking import Tracker

    cfg = DataGenerationConfig(
        num_samples=9,
        workers=0,
        envs=["MathAPI"],
        output_dir=str(tmp_path_factory.mktemp("math")),
        tracking=TrackingConfig(enabled=False),
    )
    cfg.item.max_turns, cfg.item.p_miss_func, cfg.item.p_miss_param = 1, 0.34, 0.0
    generate(cfg, Tracker(cfg.tracking))
    rows = read_rows(cfg.output_path)
    assert any(t["kind"] == "miss_func" for r in rows for t in r["turns"]), "no miss_func turn to check"
    return rows


def _llm_student(client, context_failures: bool = True):
    from palaestra.datagen.llm_roles import CountingClient, LLMReasoner
    from palaestra.shared.llm.base import SamplingParams

    return LLMReasoner(CountingClient(client, SamplingParams(max_tokens=8), context_failures=context_failures))


def test_a_prompt_longer_than_the_students_context_is_its_failure_not_a_request_error(math_rows):
    """Every turn's prompt outgrows the student's context: each turn is a failure counted as context (the
    miss_func ones too: an unread turn is no refusal), the run goes on (more than 5 such requests), and the
    graph records no tool failure (the prompt's length says nothing about a tool)."""
    from palaestra.datagen.generate import build_graph
    from palaestra.datagen.mine import evaluate_student

    client = FixedContextClient(limit=100)
    graph = build_graph(["MathAPI"], 0)
    score = evaluate_student(math_rows, _llm_student(client), graph)
    turns = sum(len(r["turns"]) for r in math_rows)
    assert client.requests == turns > 5
    assert (score.failed, score.turns, score.context) == (turns, turns, turns)
    assert set(graph.update_weights(4.0).values()) == {1.0}


def test_a_student_whose_context_holds_the_prompt_is_scored_as_before(math_rows):
    """The same student with room for the prompts: no context failures; its refusals pass the miss_func turns
    and fail the others."""
    from palaestra.datagen.mine import evaluate_student

    score = evaluate_student(math_rows, _llm_student(FixedContextClient(limit=10**6)), None)
    refusals = sum(t["kind"] == "miss_func" for r in math_rows for t in r["turns"])
    turns = sum(len(r["turns"]) for r in math_rows)
    assert (score.context, score.turns, score.failed) == (0, turns, turns - refusals)


def test_server_errors_still_stop_the_student_loudly(math_rows):
    """Only the context is a sample's failure: a server that fails every request stops the loop after five."""
    from palaestra.datagen.llm_roles import LLMUnavailable
    from palaestra.datagen.mine import evaluate_student

    client = FixedContextClient(limit=10**6, error="http://x/v1 answered 503: overloaded")
    with pytest.raises(LLMUnavailable, match="5 LLM requests in a row failed; the server answers 503"):
        evaluate_student(math_rows, _llm_student(client), None)
    assert client.requests == 5


def test_the_loop_runs_on_with_a_student_whose_context_is_too_small(tmp_path, monkeypatch):
    """datagen.mine end to end with a student that can read none of the turns: before, the sixth request stopped
    the run as if the server were down; now every mining turn is a context failure, and nothing is steered."""
    import palaestra.shared.llm as llm
    from palaestra.shared.config import TrackingConfig

    monkeypatch.setattr(llm, "make_client", lambda cfg: FixedContextClient(limit=100))
    cfg = load_config(
        {
            "job": "datagen.mine",
            "name": "small_context",
            "rounds": 2,
            "num_samples": 12,
            "workers": 0,
            "envs": ["MathAPI"],
            "heldout_fraction": 0.34,
            "student": "llm",
            "item": {"max_turns": 1},
            "output_dir": str(tmp_path),
        }
    )
    cfg.tracking = TrackingConfig(enabled=False)
    run_job(cfg)
    rounds = json.loads((tmp_path / "datagen" / "small_context" / "rounds.json").read_text())
    assert len(rounds) == 2
    for r in rounds:
        assert r["student_failure_rate"] == r["heldout_failure_rate_before"] == 1.0
        assert r["student_context_failures"] >= r["mining_samples"] > 0
        assert r["heldout_context_failures"] >= r["heldout_samples"]
    assert rounds[1]["weak_target_share"] == 0.0
