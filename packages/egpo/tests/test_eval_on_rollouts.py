"""BFCL inside training plays on the trainer's rollouts (issue 23, defect 3): the episodes go to the rollouts object
with BFCL's settings, and an env played elsewhere (a Ray worker gets a copy) still gives its per-turn responses."""

from __future__ import annotations

import pickle

import pytest

from palaestra.egpo.eval import BfclEvalConfig, build_envs, run_model
from palaestra.shared.llm.base import Completion, LLMClient, SamplingParams
from palaestra.shared.rollout.workers import LocalRollouts

pytest.importorskip("bfcl_eval")


class RecordingRollouts:
    def __init__(self, inner, remote: bool = False):
        self.inner, self.remote, self.runs = inner, remote, []

    def run(self, specs, seed, cfg=None):
        self.runs.append((len(specs), seed, cfg))
        if self.remote:  # as on a Ray worker: the envs travel as copies, the driver's are never played
            specs = pickle.loads(pickle.dumps([type(s)(_Copy(s.make_env()), s.seed, s.group_id) for s in specs]))
        return self.inner.run(specs, seed, cfg)


class _Copy:
    """A picklable `make_env` returning (its copy of) one env."""

    def __init__(self, env):
        self.env = env

    def __call__(self):
        return self.env


class PlainAnswers(LLMClient):
    """Answers every prompt with a plain sentence (no tool call: each user turn ends at its first response),
    with `tiny`'s tokenizer and chat template and no context limit of its own (BFCL's prompts exceed tiny's)."""

    def __init__(self, tiny):
        self.tokenizer, self.model, self.tiny = tiny.tokenizer, None, tiny

    def render(self, messages, tools=None, add_generation_prompt=True):
        return self.tiny.render(messages, tools, add_generation_prompt)

    def generate(self, prompts, params: SamplingParams | None = None):
        ids = self.tokenizer.encode("All done.", add_special_tokens=False) + [self.tokenizer.eos_token_id]
        n = params.n if params else 1
        return [Completion("All done.", ids, [0.0] * len(ids), list(p), "stop") for p in prompts for _ in range(n)]


@pytest.mark.parametrize("remote", [False, True])
def test_bfcl_plays_on_the_rollouts_given_with_its_settings(tiny_llm, remote):
    client = PlainAnswers(tiny_llm)
    cfg = BfclEvalConfig(max_tokens_per_turn=6, max_context_tokens=30000, max_model_calls=5, seed=3)
    envs, _ = build_envs("multi_turn_base", 2)
    rollouts = RecordingRollouts(LocalRollouts(client, _any_settings()), remote=remote)
    results = run_model(envs, client, cfg, rollouts)
    [(n, seed, settings)] = rollouts.runs
    assert (n, seed) == (2, 3)
    assert (settings.max_tokens_per_turn, settings.max_context_tokens, settings.max_turns) == (6, 30000, 5)
    assert (settings.temperature, settings.group_size) == (0.0, 1)  # BFCL decodes greedily, one episode each
    # the same greedy episodes in this process: outputs and per-turn responses come back either way
    here, _ = build_envs("multi_turn_base", 2)
    expected = run_model(here, client, cfg)
    assert all(env.result is not None for env in here)  # four user turns, one plain answer each: finished
    for got, want, env in zip(results, expected, here):
        assert got["outputs"] == want["outputs"] == ["All done."] * 4 and got["reward"] == want["reward"]
        assert got["turn_outputs"] == env.responses == [["All done."]] * 4  # the env's own per-turn record
    if remote:
        assert all(not hasattr(env, "responses") for env in envs)  # never played here


def _any_settings():
    from palaestra.shared.rollout.engine import RolloutConfig

    return RolloutConfig(group_size=4, max_tokens_per_turn=99, temperature=1.0)  # the training rollout's
