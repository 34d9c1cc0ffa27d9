"""Interruptible generation on the transformers backend (hf_decode ``at_boundary``): a weight update that lands
after token j of a generation. Against a reference written apart from the loop (no cache: a full forward over
every live row's prompt and tokens at each step, the weights switched before token j, the same sampling rule
and random draws), the tokens are equal one for one, and each token's version is the one that sampled it.
Negative control: the reference that never switches differs, so the update did change the tokens."""

import pytest

from palaestra.shared.llm import LLMConfig, LLMError, SamplingParams, make_client
from palaestra.shared.testing import switching_reference, two_weight_versions

PROMPTS = ["Hello world", "1 2 3 4", "Once upon a time there was"]
MAX_TOKENS, SWITCH = 10, 4


@pytest.fixture(scope="module")
def weights():
    return two_weight_versions()


def reference(client, old, new, params: SamplingParams, switch: int | None) -> list[list[int]]:
    """Each prompt's tokens, generated with no cache: weights `new` from token `switch` on (None: never)."""
    return switching_reference(client, old, new, PROMPTS, params, switch)


def interrupted(client, old, new, params: SamplingParams):
    """The client's generation, with `new` weights offered (and loaded) at the boundary after token SWITCH."""
    client.model.load_state_dict(old)
    calls = []

    def at_boundary() -> int:  # called before the prefill, then after each token
        calls.append(len(calls))
        if len(calls) == SWITCH + 1:
            client.load_weights(new)
        return 1 if len(calls) > SWITCH else 0

    out = client.generate(PROMPTS, params, at_boundary=at_boundary)
    client.model.load_state_dict(old)
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, n=1),
        SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, n=2, seed=11),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=MAX_TOKENS, n=2, seed=3),
    ],
    ids=["greedy", "sampled", "tempered_truncated"],
)
def test_a_generation_spanning_a_weight_update_equals_the_switching_reference(weights, params):
    client, old, new = weights
    out = interrupted(client, old, new, params)  # seeded: the client seeds a forked RNG as the reference does
    switched, unswitched = reference(client, old, new, params, SWITCH), reference(client, old, new, params, None)
    by_rows = [c.token_ids for c in out]
    assert by_rows == switched
    for c in out:
        n = len(c.token_ids)
        assert c.extra["token_versions"] == [0] * min(n, SWITCH) + [1] * max(0, n - SWITCH)
    long_rows = [i for i, c in enumerate(by_rows) if len(c) > SWITCH]
    assert long_rows, "no row outlived the switch: the test would check nothing"
    assert any(by_rows[i] != unswitched[i][: len(by_rows[i])] for i in long_rows)  # negative control


def test_without_an_update_the_versions_stay_and_tokens_equal_plain_generation(weights):
    client, old, _ = weights
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, n=2, seed=5)
    client.model.load_state_dict(old)
    plain = client.generate(PROMPTS, params)
    steady = client.generate(PROMPTS, params, at_boundary=lambda: 0)
    assert [c.token_ids for c in steady] == [c.token_ids for c in plain]
    assert all(c.extra["token_versions"] == [0] * len(c.token_ids) for c in steady)
    assert all("token_versions" not in c.extra for c in plain)


def test_generate_path_refuses_interruption():
    client = make_client(LLMConfig(model="tiny", device="cpu", dtype="float32", hf_generate=True))
    with pytest.raises(LLMError, match="hf_generate=false"):
        client.generate(["Hi"], SamplingParams(max_tokens=2), at_boundary=lambda: 0)
