"""The critic's hints never reveal the answer; LLM roles survive junk (counted drops, no crash)."""

from __future__ import annotations

import json
import random
import re

import pytest

from palaestra.datagen.chain import TurnTask, guided_chain
from palaestra.datagen.envs import BFCL_CLASSES, ToolEnv, get_env
from palaestra.datagen.graph import ApiGraph
from palaestra.datagen.pipeline import ItemConfig, generate_item
from palaestra.datagen.roles import (
    DeterministicCritic,
    DeterministicQueryWriter,
    DeterministicReasoner,
    DeterministicToolMaker,
    Roles,
    openai_tools,
)
from palaestra.datagen.sampler import sample_trace
from palaestra.shared.llm.base import Completion, LLMClient, SamplingParams


class LeakyCritic:
    """A critic that tries to give the answer away: the calls and every value."""

    name = "leaky"

    def critique(self, turn, calls, failure, rng):
        values = [str(v) for s in turn.trace.steps for v in s.arguments.values()]
        return "Just do: " + "; ".join(turn.trace.calls) + " using " + ", ".join(values)


class RecordingReasoner(DeterministicReasoner):
    """Always skips hidden steps on the first try; records the prompts it sees."""

    def __init__(self):
        super().__init__(naive_first_try=1.0)
        self.prompts = []

    def act(self, messages, tools, turn, try_index, rng):
        user = [m["content"] for m in messages if m["role"] == "user"]
        if user:
            self.prompts.append(user[-1])
        return super().act(messages, tools, turn, try_index, rng)


def _leaks(hint: str, trace) -> list[str]:
    """Ground-truth calls and argument values (2+ characters, as whole tokens) found in `hint`."""
    found = [c for c in trace.calls if c in hint]
    for step in trace.steps:
        for value in step.arguments.values():
            for v in value if isinstance(value, list) else [value]:
                s = str(v)
                if len(s) >= 2 and re.search(rf"(?<![A-Za-z0-9_]){re.escape(s)}(?![A-Za-z0-9_])", hint, re.I):
                    found.append(s)
    return found


def test_hints_never_contain_ground_truth_calls_or_values():
    graph = ApiGraph()
    for name in BFCL_CLASSES:
        graph.add_env(get_env(name))
    hints_seen = 0
    for critic in (DeterministicCritic(), LeakyCritic()):
        for i in range(60):
            spec = get_env(list(BFCL_CLASSES)[i % 8])
            rng = random.Random(i)
            env = ToolEnv(spec, i)
            trace, _ = sample_trace(env, graph, spec.tool_names[i % len(spec.tool_names)], rng, 5)
            if not trace.hidden:
                continue
            reasoner = RecordingReasoner()
            roles = Roles(DeterministicToolMaker(), DeterministicQueryWriter(), reasoner, critic)
            turn = TurnTask("Do the task.", trace, openai_tools(spec))
            stats = {}
            result = guided_chain(roles, env, [], turn, 3, rng, 12, stats)
            assert result is not None and stats["tries"][1] == 1  # failed once, passed after the hint
            hinted = [p for p in reasoner.prompts if "Hint from a reviewer" in p]
            assert hinted
            for prompt in hinted:
                hints_seen += 1
                assert _leaks(prompt.split("(Hint from a reviewer:")[1], trace) == [], prompt
            # the kept conversation carries the original request, not the hint
            assert all("Hint" not in (m["content"] or "") for m in result.messages if m["role"] == "user")
    assert hints_seen >= 20


class JunkClient(LLMClient):
    """Returns junk, nothing, or raises, in turn."""

    def __init__(self):
        self.n = 0

    def chat(self, conversations, params=None, tools=None):
        self.n += 1
        kind = self.n % 4
        if kind == 3:
            raise RuntimeError("backend fell over")
        text = ["", "\x00<tool_call>{not json</tool_call>", "<think>zz</think> ###"][kind]
        return [Completion(text, [], None, [], "stop") for _ in conversations]


def test_llm_roles_survive_junk_and_count_drops():
    from palaestra.datagen.llm_roles import CountingClient, LLMCritic, LLMQueryWriter, LLMReasoner, LLMToolMaker

    graph = ApiGraph()
    graph.add_env(get_env("MathAPI"), probe=False)
    # junk answers in prose: counted, not stopped (five in a row would stop a real run: test_llm_failures)
    counter = CountingClient(JunkClient(), SamplingParams(max_tokens=16), max_consecutive_errors=0)
    all_llm = Roles(LLMToolMaker(counter), LLMQueryWriter(counter), LLMReasoner(counter), LLMCritic(counter))
    only_reasoner = Roles(
        DeterministicToolMaker(), DeterministicQueryWriter(), LLMReasoner(counter), LLMCritic(counter)
    )
    drops = {}
    for roles in (all_llm, only_reasoner):
        for i in range(6):
            item = {"id": f"j{i}", "env": "MathAPI", "target": "add", "seed": i, "scenario": 0, "round": 0}
            out = generate_item(item, graph, roles, ItemConfig(max_turns=1, k_max=2), counter)
            assert out["sample"] is None
            drops[out["drop"]] = drops.get(out["drop"], 0) + 1
            assert out["llm_calls"] >= 1
    roles_seen = {d.split(":")[0] for d in drops}
    assert roles_seen <= {"tool_maker", "query_writer", "unverified", "reasoner"} and all(":" in d for d in drops)
    assert sum(n for d, n in drops.items() if d.startswith(("unverified:", "reasoner:"))) >= 6
    assert counter.errors >= 1
    assert set(counter.drops) <= {f"{r}:{why}" for r in ("tool_maker", "query_writer", "critic")
                                  for why in ("no_json", "bad_name", "bad_description", "length", "missing_value",
                                              "names_tool", "empty")} | {"reasoner:prose"}  # fmt: skip


@pytest.mark.slow
def test_tiny_model_pipeline_runs(tiny_llm):
    """The real tiny model through every LLM role: junk becomes counted drops."""
    from palaestra.datagen.llm_roles import CountingClient, LLMCritic, LLMReasoner, LLMToolMaker

    graph = ApiGraph()
    graph.add_env(get_env("MathAPI"), probe=False)
    counter = CountingClient(tiny_llm, SamplingParams(max_tokens=24, temperature=1.0, seed=0))
    roles = Roles(LLMToolMaker(counter), DeterministicQueryWriter(), LLMReasoner(counter), LLMCritic(counter))
    item = {"id": "t0", "env": "MathAPI", "target": "add", "seed": 0, "scenario": 0, "round": 0}
    out = generate_item(item, graph, roles, ItemConfig(max_turns=1, k_max=2, max_steps=2), counter)
    assert out["drop"] is None or out["drop"].split(":")[0] in ("tool_maker", "unverified", "reasoner")
    assert out["llm_calls"] >= 1


@pytest.mark.slow
def test_smollm2_135m_through_every_role(tmp_path):
    """SmolLM2-135M plays every role (short): the run completes and each sample is kept or dropped for a reason."""
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import RolesConfig
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.tracking import Tracker

    llm = LLMConfig(backend="transformers", model="smollm2-135m", device="cpu")
    cfg = DataGenerationConfig(
        num_samples=2,
        workers=0,
        envs=["MathAPI"],
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        roles=RolesConfig(
            tool_maker="llm",
            query_writer="llm",
            reasoner="llm",
            critic="llm",
            llm=llm,
            sampling=SamplingParams(temperature=0.7, max_tokens=48, seed=0),
        ),
        item=ItemConfig(max_turns=1, k_max=1, max_steps=2, p_miss_func=0.0, p_miss_param=0.0),
        log_samples=False,
    )
    result = generate(cfg, Tracker(cfg.tracking))
    assert result["kept"] + result["dropped"] == 2
    stats = json.loads((cfg.output_path.parent / "stats.json").read_text())
    assert all(reason.split(":")[0] in ("tool_maker", "query_writer", "unverified") for reason in stats["drops"])
    assert stats["llm_calls"] >= 2 and stats["ungrounded_kept"] == 0
