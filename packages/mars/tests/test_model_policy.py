"""Reading a tabular policy off a model: information-state prompts, OpenSpiel exploitability, the eval metric."""

from __future__ import annotations

import math

import pytest

from palaestra.mars.model_policy import exploitability, information_state_prompts, read_policy, response_scorer
from palaestra.mars.solvers import equilibrium_policy


def test_kuhn_has_twelve_information_states_each_shown_as_the_seat_sees_it():
    prompts = information_state_prompts("kuhn_poker", prompt="compact")
    assert len(prompts) == 12
    cards = "JQK"
    for key, (player, conversation, legal, strings) in prompts.items():
        # OpenSpiel's Kuhn information state: the card index then the betting ("p" pass, "b" bet)
        assert player == (len(key) - 1) % 2
        assert legal == [0, 1] and strings == ["<PASS>", "<BET>"]
        assert f"Your card: {cards[int(key[0])]}." in conversation[-1]["content"]
        own_turns = [m["content"] for m in conversation if m["role"] == "assistant"]
        own_moves = key[1 + player :: 2]  # this seat's earlier actions in the betting string
        assert own_turns == [f"<think></think><answer>{'<PASS>' if c == 'p' else '<BET>'}</answer>" for c in own_moves]


def _fixed_scorer(table: dict[str, dict[str, float]]):
    """A scorer that returns log-probabilities from a table keyed by the prompt's last user message."""

    def score(conversation, responses):
        probs = table[conversation[-1]["content"]]
        return [math.log(probs[r]) for r in responses]

    return score


def test_uniform_and_equilibrium_policies_read_through_prompts(tmp_path):
    prompts = information_state_prompts("kuhn_poker")
    uniform = {
        c[-1]["content"]: {"<think></think><answer><PASS></answer>": 0.5, "<think></think><answer><BET></answer>": 0.5}
        for _, c, _, _ in prompts.values()
    }
    tabular, table = read_policy(_fixed_scorer(uniform), "kuhn_poker")
    # Kuhn poker's uniform policy: NashConv 11/12, exploitability 11/24 (OpenSpiel's exploitability_test)
    assert exploitability(tabular, "kuhn_poker") == pytest.approx(11 / 24, abs=1e-9)
    assert all(p == [0.5, 0.5] for p in table.values())
    # CFR's equilibrium, handed over as unnormalized log-probabilities, reads back to a near-zero exploitability
    eq = equilibrium_policy("kuhn_poker", iterations=500, cache_dir=tmp_path)
    by_prompt = {}
    for key, (_, conversation, _, strings) in prompts.items():
        probs = dict(eq.table[key])
        by_prompt[conversation[-1]["content"]] = {
            f"<think></think><answer>{s}</answer>": 3.0 * max(probs[a], 1e-12) for a, s in enumerate(strings)
        }
    tabular, _ = read_policy(_fixed_scorer(by_prompt), "kuhn_poker")
    assert exploitability(tabular, "kuhn_poker") == pytest.approx(eq.exploitability, abs=1e-6)


def test_tiny_model_policy_is_a_distribution_with_bounded_exploitability():
    from palaestra.shared.llm import LLMConfig, make_client

    client = make_client(LLMConfig(model="tiny", device="cpu"))
    score = response_scorer(client)
    prompts = information_state_prompts("kuhn_poker")
    _, conversation, _, strings = prompts["0"]
    logps = score(conversation, [f"<think></think><answer>{s}</answer>" for s in strings])
    assert all(lp < 0 for lp in logps)
    tabular, table = read_policy(score, "kuhn_poker")
    assert all(abs(sum(p) - 1) < 1e-9 for p in table.values())
    # exploitability of any Kuhn policy lies in [0, max]; the max (always-pass vs a better responder) < 1
    assert 0.0 <= exploitability(tabular, "kuhn_poker") < 1.0
    with pytest.raises(ValueError, match="needs a local model"):
        response_scorer(object())


def test_evaluate_logs_the_exploitability_of_the_policy_under_test():
    from palaestra.mars.eval import GameEvalConfig, evaluate
    from palaestra.shared.config import ConfigError
    from palaestra.shared.llm import LLMConfig, make_client

    llm = LLMConfig(model="tiny", device="cpu")
    client = make_client(llm)
    metrics, records = evaluate(
        GameEvalConfig(games=[], exploitability=["kuhn_poker"], llm=llm), clients={repr(llm): client}
    )
    expected = exploitability(read_policy(response_scorer(client), "kuhn_poker")[0], "kuhn_poker")
    assert metrics["eval/kuhn_poker/exploitability"] == pytest.approx(expected, abs=1e-5)  # float32 forward noise
    assert records[0]["exploitability"] == pytest.approx(expected, abs=1e-5) and len(records[0]["policy"]) == 12
    with pytest.raises(ConfigError, match="has no reference solver"):
        evaluate(GameEvalConfig(games=[], exploitability=["tic_tac_toe"], llm=llm))


def test_scored_tokens_are_the_templates_rendering_of_the_response():
    """The model is trained on (and samples) the response as the chat template writes it; the project's template
    puts a newline after </think>. Scoring the raw string instead measured an off-distribution string."""
    from palaestra.mars.model_policy import response_tokens
    from palaestra.shared.llm import LLMConfig, make_client

    client = make_client(LLMConfig(model="tiny", device="cpu"))
    conversation = information_state_prompts("kuhn_poker")["1b"][1]
    prompt_ids = client.render(conversation)
    ids = response_tokens(client, conversation, prompt_ids, "<think></think><answer><BET></answer>")
    rendered = client.tokenizer.apply_chat_template(
        [*conversation, {"role": "assistant", "content": "<think></think><answer><BET></answer>"}], tokenize=False
    )
    generation_prompt = client.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    expected = rendered[len(generation_prompt) :].split("</answer>")[0] + "</answer>"
    assert client.tokenizer.decode(ids) == expected
    assert "</think>\n<answer>" in expected  # this template's rendering differs from the raw string


def test_read_off_equals_the_policy_sampled_after_a_forced_response_prefix():
    """With ``rollout.response_prefix`` (kuhn_cpu.yaml: ``<think></think>\\n<answer><``) the model samples only what
    follows the prefix. The read-off scores whole responses; the prefix is common to both actions, so after
    normalizing over them it equals P(rest | prompt + prefix), computed here as the rollout engine builds it."""
    import torch

    from palaestra.shared.llm import LLMConfig, make_client

    client = make_client(LLMConfig(model="tiny", device="cpu", seed=3))
    tok, model = client.tokenizer, client.model
    prefix = "<think></think>\n<answer><"
    prefix_ids = tok.encode(prefix, add_special_tokens=False)  # the engine's prompt tokens after the template
    _, table = read_policy(response_scorer(client), "kuhn_poker", "minimal")
    for key, (_, conversation, legal, strings) in information_state_prompts("kuhn_poker", "minimal").items():
        prompt = client.render(conversation) + prefix_ids
        logps = []
        for s in strings:  # the sampled continuation: the action without its "<", then "</answer>"
            rest = tok.encode(s[1:] + "</answer>", add_special_tokens=False)
            ids = torch.tensor([prompt + rest])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logps.append(float(torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).sum()))
        z = math.log(sum(math.exp(lp) for lp in logps))
        expected = [math.exp(lp - z) for lp in logps]
        assert [table[key][a] for a in legal] == pytest.approx(expected, abs=1e-5), key
