"""Interruptible generation on the vllm backend: a weight update may land inside one generation.

vLLM's offline engine takes no new weights inside one ``LLM.generate`` call, so an interruptible call
(``generate(..., at_boundary=fn)``, the engine's ``newest`` schedule ahead of the learner) runs in segments of
``llm.vllm_segment_tokens`` tokens. Before the first segment and after each one `at_boundary` may load the
weights offered since (the client's `load_weights`, which drops the prefix cache) and returns the version held.
Every live sequence then continues from its prompt + the tokens it has, as token ids (no re-tokenization),
its keys and values computed again under the weights it now samples with, as hf_decode does after an update;
each token is tagged with the version that sampled it (``extra["token_versions"]``).

What a segment boundary changes, and how it is kept right:
- each of a prompt's ``n`` samples is its own request with its own seed per segment (the seed, the sample and
  the segment index): one seed for every segment would reuse one random stream at every segment's start;
- a stop string that spans two segments is found in the decoded tokens and the sequence is cut after it;
- a sequence ends on vLLM's own stop (an end token or a stop string inside a segment), at ``max_tokens`` or at
  the model's context.
Greedy tokens are the uninterrupted call's, and after an update at token j those of a generation whose weights
switched before token j (shared/tests/test_vllm_interruptible.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from palaestra.shared.llm.base import Completion, SamplingParams


@dataclass
class _Row:
    prompt: list[int]
    seed: int | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None


def sample_logprobs(sample: Any) -> list[float] | None:
    """The log-prob vLLM gave each sampled token (None when it gave none)."""
    if sample.logprobs is None:
        return None
    return [step[t].logprob for t, step in zip(sample.token_ids, sample.logprobs)]


def generate_in_segments(
    client: Any, prompts: list[list[int]], params: SamplingParams, at_boundary: Any, lora_request: Any = None
) -> list[Completion]:
    """`params.n` completions per prompt (consecutively), each token sampled by the weights `at_boundary`
    reported before its segment. `client`: the `VLLMClient` (its ``llm``, tokenizer, config and sampling)."""
    seed = params.seed
    rows = [_Row(p, None if seed is None else seed * 1_000_003 + j) for p in prompts for j in range(params.n)]
    version, segment = at_boundary(), 0
    while live := [r for r in rows if r.finish is None]:
        requests, settings = [], []
        for r in live:
            requests.append({"prompt_token_ids": r.prompt + r.tokens})  # vLLM's TokensPrompt (a TypedDict)
            budget = min(client.config.vllm_segment_tokens, params.max_tokens - len(r.tokens))
            row_seed = None if r.seed is None else r.seed * 10_007 + segment
            settings.append(client.vllm_sampling(params, n=1, max_tokens=budget, seed=row_seed))
        outputs = client.llm.generate(requests, settings, lora_request=lora_request, use_tqdm=False)
        for r, request in zip(live, outputs):
            sample = request.outputs[0]
            r.tokens += sample.token_ids
            r.logprobs += sample_logprobs(sample) or []
            r.versions += [version] * len(sample.token_ids)
            if sample.finish_reason != "length" or _cut_at_stop(client.tokenizer, r, params.stop):
                r.finish = "stop"
            elif len(r.tokens) >= params.max_tokens or len(r.prompt) + len(r.tokens) >= client.context_length:
                r.finish = "length"
        version, segment = at_boundary(), segment + 1
    completions = []
    for r in rows:
        text = client.tokenizer.decode(r.tokens, skip_special_tokens=True)
        logprobs = r.logprobs if params.logprobs and len(r.logprobs) == len(r.tokens) else None
        completion = Completion(text, r.tokens, logprobs, list(r.prompt), r.finish or "length")
        completion.extra["token_versions"] = r.versions
        completions.append(completion)
    return completions


def _cut_at_stop(tokenizer: Any, row: _Row, stop: list[str]) -> bool:
    """Whether a stop string spans a segment boundary; if so the row is cut after the first token that ends one."""
    if not stop or not any(s in tokenizer.decode(row.tokens, skip_special_tokens=True) for s in stop):
        return False
    k = next(
        k
        for k in range(1, len(row.tokens) + 1)
        if any(s in tokenizer.decode(row.tokens[:k], skip_special_tokens=True) for s in stop)
    )
    row.tokens, row.logprobs, row.versions = row.tokens[:k], row.logprobs[:k], row.versions[:k]
    return True
