"""A scripted `LLMClient`: answers every game prompt with a uniformly random legal action, as tokens.

It reads the last ``LEGAL ACTIONS:`` list in the decoded prompt and returns
``<think></think><answer>ACTION</answer>`` tokenized by a real tokenizer (the
embedded `tiny` model's by default), followed by the end-of-turn token. With
it the whole rollout path (chat template, token deltas, engine bookkeeping,
env parsing) runs without a neural network: the benchmark measures that path's
overhead with it, and tests check that a legal player is never penalized.
"""

from __future__ import annotations

import random

from palaestra.mars.env import render_response
from palaestra.shared.llm.base import Completion, LLMClient, SamplingParams


class ScriptedLegalClient(LLMClient):
    def __init__(self, tokenizer=None, seed: int = 0):
        if tokenizer is None:
            from transformers import AutoTokenizer

            from palaestra.shared.llm.models import resolve_model_path

            tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.eos = tokenizer.eos_token_id

    def generate(self, prompts, params: SamplingParams | None = None) -> list[Completion]:
        params = params or SamplingParams()
        out = []
        for prompt in prompts:
            ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt, add_special_tokens=False)
            text_prompt = self.tokenizer.decode(ids[-400:])  # the legal actions close the prompt
            legal = text_prompt.rsplit("LEGAL ACTIONS:\n", 1)[-1].split(".", 1)[0]
            for _ in range(params.n):
                action = self.rng.choice([a.strip() for a in legal.split(", ") if a.strip()])
                text = render_response(action)
                tokens = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]
                out.append(Completion(text, tokens, [0.0] * len(tokens), list(ids), "stop"))
        return out
