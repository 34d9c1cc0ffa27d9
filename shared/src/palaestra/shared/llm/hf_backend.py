"""The `transformers` backend: batched generation on CPU or GPU, by the lean decode loop of `hf_decode` (default)
or by ``model.generate`` (``llm.hf_generate: true``).

Prompts (token ids, or text encoded without special tokens) are sorted by
length, left-padded and generated in chunks of ``max_batch_size``; results come
back in the caller's order, ``n`` consecutive completions per prompt.

Each completion keeps the generated token ids exactly as sampled, including the
end-of-turn token (``<|im_end|>``) when the model emitted one; its ``text``
leaves that token out. Stop strings end a sequence on the token that completes
the stop string: the tokens after it are dropped and the text is cut just after
the stop string (which it includes).

Logprobs are of the sampled tokens under the model itself: log-softmax of the
raw logits, before temperature and top-p; with ``llm.logprobs_mode: processed``
under the tempered, filtered distribution each was drawn from (base.py
`LogprobsMode`: what the behaviour correction needs). Both paths
score each step as it comes (``generate``'s through a logits processor), so
memory stays O(batch x vocab) instead of HF's ``output_logits`` O(batch x steps
x vocab). The two paths give the same greedy tokens and sample by the same rule
(HF's temperature, top-k, top-p); a seed draws different samples in each.

``seed`` makes a call reproducible: sampling runs under a forked torch RNG
seeded with it (the global RNG is left untouched).

``top_logprobs`` (k > 0) also records the k most likely tokens of each step
from the same raw logits. ``generate(..., on_step=fn)`` calls ``fn(positions,
tokens)`` after every decode step (the output positions of the batch's rows and
the token each row just got) and ends the rows it flags: ``palaestra serve``
streams tokens and cancels a disconnected client's rows through it.
``generate(..., at_boundary=fn)`` is interruptible generation (the decode loop only): weights loaded at a token
boundary take over the rows in flight, which keep their tokens; ``extra["token_versions"]`` tags each token
with the version ``fn`` named when it was sampled (hf_decode).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import cast

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.utils import logging as hf_logging

from palaestra.shared.llm.base import Completion, LLMClient, LLMConfig, LLMError, LogprobsMode, SamplingParams
from palaestra.shared.llm.hf_decode import AtBoundary, StopRows, decode
from palaestra.shared.llm.hf_logprobs import LogprobRecorder, Warp
from palaestra.shared.llm.models import load_tokenizer, resolve_model_path

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

StepHook = Callable[[list[int], list[int]], "list[bool] | None"]
"""``fn(positions, tokens) -> stop flags``: after each decode step, each row's output position and new token."""


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LLMError(f"device '{device}' requested but no CUDA GPU is available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise LLMError(f"unknown dtype '{dtype}' (auto, {', '.join(_DTYPES)})")
    return _DTYPES[dtype]


def _top_pairs(ids: torch.Tensor, values: torch.Tensor) -> list[list[list[list[float | int]]]]:
    """Per row, per generated token: ``[[token_id, logprob], ...]``."""
    return [
        [[[i, v] for i, v in zip(step_ids, step_values)] for step_ids, step_values in zip(row_ids, row_values)]
        for row_ids, row_values in zip(ids.tolist(), values.tolist())
    ]


class _StepHookCriteria(StoppingCriteria):
    """Runs a `StepHook` after each decode step; the rows it flags end there."""

    def __init__(self, hook: StepHook, positions: list[int]) -> None:
        self.hook, self.positions = hook, positions

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        stop = self.hook(self.positions, input_ids[:, -1].tolist())
        flags = stop if stop is not None else [False] * input_ids.shape[0]
        return cast(torch.BoolTensor, torch.tensor(flags, dtype=torch.bool, device=input_ids.device))


class _StopOnStrings(StoppingCriteria):
    """Marks a sequence done once its generated text contains a stop string (checks a short tail window)."""

    def __init__(self, tokenizer, stops: list[str], prompt_len: int) -> None:
        self.tokenizer, self.stops, self.prompt_len = tokenizer, stops, prompt_len
        # a byte-level token may carry only part of a character: look back generously
        self.window = 2 * max(len(s) for s in stops) + 4

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return self.flags(input_ids[:, self.prompt_len :])  # type: ignore[return-value]

    def flags(self, generated: torch.Tensor) -> torch.Tensor:
        """[rows] bool: the last `window` generated tokens of a row contain a stop string."""
        texts = self.tokenizer.batch_decode(generated[:, -self.window :].tolist())
        return torch.tensor([any(s in t for s in self.stops) for t in texts], device=generated.device)


class TransformersClient(LLMClient):
    """`LLMClient` over a local transformers causal LM (`tiny`, `smollm2-135m`, an HF directory)."""

    def __init__(self, config: LLMConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        path = resolve_model_path(config.model, seed=config.seed)
        hf_logging.disable_progress_bar()  # a bar per load is noise in logs of many workers
        try:
            self.tokenizer = load_tokenizer(config.model, path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
            self.model = model.to(self.device).eval()  # type: ignore[arg-type]  # transformers types .to() narrowly
        except (OSError, ValueError) as err:
            raise LLMError(f"could not load model '{config.model}' from {path}: {str(err).splitlines()[0]}") from None
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        self.eos_token_ids: list[int] = [eos] if isinstance(eos, int) else list(eos)
        self.context_length: int = int(
            getattr(self.model.config, "max_position_embeddings", None) or self.tokenizer.model_max_length
        )

    # -- generation -------------------------------------------------------------------------------------------

    @property
    def interruptible(self) -> bool:
        return not self.config.hf_generate  # the decode loop takes at_boundary, model.generate does not

    def generate(
        self,
        prompts: list[list[int]] | list[str],
        params: SamplingParams | None = None,
        on_step: StepHook | None = None,
        at_boundary: AtBoundary | None = None,
    ) -> list[Completion]:
        """`at_boundary`: interruptible generation (hf_decode's loop): asked at every token boundary for the
        version of the weights the model holds (loading newer ones first); each completion's
        ``extra["token_versions"]`` says which version sampled each token."""
        params = params or SamplingParams()
        _check_params(params)
        if at_boundary is not None and self.config.hf_generate:
            raise LLMError("interruptible generation (at_boundary) needs the decode loop: set llm.hf_generate=false")
        prompt_ids = [self._prompt_ids(p) for p in prompts]
        for i, ids in enumerate(prompt_ids):
            if not ids:
                raise LLMError(f"prompt {i} is empty (no tokens)")
            if len(ids) >= self.context_length:
                raise LLMError(
                    f"prompt {i} has {len(ids)} tokens; the model's context is {self.context_length} tokens "
                    f"({self.config.model})"
                )
        work = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        # similar lengths in one batch: less padding
        order = sorted(range(len(work)), key=lambda j: len(prompt_ids[work[j]]))
        out: list[Completion | None] = [None] * len(work)
        rng = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])
        with rng if params.seed is not None else nullcontext():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            size = max(1, self.config.max_batch_size)
            for start in range(0, len(order), size):
                chunk = order[start : start + size]
                batch = [prompt_ids[work[j]] for j in chunk]
                for j, completion in zip(chunk, self._generate_batch(batch, params, on_step, chunk, at_boundary)):
                    out[j] = completion
        return out  # type: ignore[return-value]

    def _prompt_ids(self, prompt: list[int] | str) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        return [int(t) for t in prompt]

    def generation_config(self, params: SamplingParams, max_new_tokens: int, warped: bool = False) -> GenerationConfig:
        """The `GenerationConfig` for `params` (built from scratch: no model defaults such as top_k=50 sneak in);
        `warped`: the sampling warpers run as a processor of ours (`Warp`), not generate's."""
        sample = params.temperature > 0
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=(1.0 if warped else params.temperature) if sample else None,
            top_p=(1.0 if warped else params.top_p) if sample else None,
            top_k=(0 if warped else params.top_k) if sample else None,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
        )

    def batch_inputs(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded input ids and attention mask for `batch`."""
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, prompt in enumerate(batch):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def _generate_batch(
        self,
        batch: list[list[int]],
        params: SamplingParams,
        on_step: StepHook | None = None,
        positions: list[int] | None = None,
        at_boundary: AtBoundary | None = None,
    ) -> list[Completion]:
        input_ids, attention_mask = self.batch_inputs(batch)
        width = input_ids.shape[1]
        max_new = min(params.max_tokens, self.context_length - width)
        positions = positions if positions is not None else list(range(len(batch)))
        strings = _StopOnStrings(self.tokenizer, params.stop, width) if params.stop else None
        top_k = params.top_logprobs if params.logprobs else 0
        processed = self.config.logprobs_mode == LogprobsMode.processed and params.temperature > 0
        t0, versions = time.perf_counter(), None
        if self.config.hf_generate:
            recorder = LogprobRecorder(top_k=top_k)
            criteria = StoppingCriteriaList([strings] if strings else [])
            if on_step is not None:
                criteria.append(_StepHookCriteria(on_step, positions))
            sequences = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=self.generation_config(params, max_new, warped=processed),
                logits_processor=LogitsProcessorList([Warp(params), recorder] if processed else [recorder]),
                stopping_criteria=criteria,
            )
            generated, scores, top = sequences[:, width:], recorder.finish(sequences), recorder.top_logprobs()
        else:
            sample = params.temperature > 0
            out = decode(
                self.model,
                input_ids,
                attention_mask,
                max_new_tokens=max_new,
                eos_ids=self.eos_token_ids,
                pad_id=self.tokenizer.pad_token_id,
                temperature=params.temperature,
                top_p=params.top_p if sample else 1.0,
                top_k=params.top_k if sample else 0,
                top_logprobs=top_k,
                stop_rows=_loop_stops(strings, on_step, positions),
                processed_logprobs=processed,
                at_boundary=at_boundary,
            )
            generated, scores, versions = out.tokens, out.logprobs, out.versions
            top = (out.top_ids, out.top_logprobs) if out.top_ids is not None and out.top_logprobs is not None else None
        elapsed = time.perf_counter() - t0
        logprobs = scores.cpu().tolist() if params.logprobs else None
        pairs = _top_pairs(*top) if top else None
        rows = generated.cpu().tolist()
        completions = []
        for row, (prompt, tokens) in enumerate(zip(batch, rows)):
            completion = self._finish(prompt, tokens, logprobs[row] if logprobs else None, params)
            completion.extra["batch_seconds"] = elapsed
            if pairs:
                completion.extra["top_logprobs"] = pairs[row][: len(completion.token_ids)]
            if versions is not None:
                completion.extra["token_versions"] = versions[row].tolist()[: len(completion.token_ids)]
            completions.append(completion)
        return completions

    def _finish(
        self, prompt: list[int], tokens: list[int], logprobs: list[float] | None, params: SamplingParams
    ) -> Completion:
        """Cut one generated row at its end-of-turn token or stop string; decode it."""
        finish = "length"
        end = len(tokens)
        eos_at = next((k for k, t in enumerate(tokens) if t in self.eos_token_ids), None)
        if eos_at is not None:
            end, finish = eos_at + 1, "stop"
        text_end = eos_at if eos_at is not None else end
        text = self.tokenizer.decode(tokens[:text_end])
        if params.stop:
            hit = _first_stop(text, params.stop)
            if hit is not None:
                end = self._tokens_through(tokens[:text_end], params.stop)
                text = self.tokenizer.decode(tokens[:end])
                text = text[: _first_stop(text, params.stop)]
                finish = "stop"
        lp = logprobs[:end] if logprobs is not None else None
        if lp is not None and any(math.isnan(x) for x in lp):
            raise LLMError("the model produced NaN logprobs (bad weights or dtype)")
        return Completion(text, tokens[:end], lp, list(prompt), finish)

    def _tokens_through(self, tokens: list[int], stops: list[str]) -> int:
        """The fewest leading tokens whose text contains a stop string (binary search; containment is monotone)."""
        lo, hi = 1, len(tokens)
        while lo < hi:
            mid = (lo + hi) // 2
            if _first_stop(self.tokenizer.decode(tokens[:mid]), stops) is not None:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # -- weights ----------------------------------------------------------------------------------------------

    def load_weights(self, state_dict: dict) -> None:
        """Copy `state_dict` into the model (a partial dict updates only those tensors; unknown names are errors)."""
        own = self.model.state_dict()
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            raise LLMError(f"load_weights: {len(unknown)} unknown parameter name(s), e.g. {unknown[:3]}")
        with torch.no_grad():
            for name, value in state_dict.items():
                if own[name].shape != value.shape:
                    shapes = f"{tuple(value.shape)}, expected {tuple(own[name].shape)}"
                    raise LLMError(f"load_weights: {name} has shape {shapes}")
                own[name].copy_(value)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _loop_stops(strings: _StopOnStrings | None, on_step: StepHook | None, positions: list[int]) -> StopRows | None:
    """The decode loop's per-step end check: stop strings and the step hook (called on the live rows only)."""
    if strings is None and on_step is None:
        return None

    def stop_rows(live: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        flags = strings.flags(generated) if strings is not None else torch.zeros(len(live), dtype=torch.bool)
        if on_step is not None:
            hooked = on_step([positions[r] for r in live.tolist()], generated[:, -1].tolist())
            if hooked is not None:
                flags = flags.cpu() | torch.tensor(hooked, dtype=torch.bool)
        return flags

    return stop_rows


def _first_stop(text: str, stops: list[str]) -> int | None:
    """End index of the earliest stop string in `text`, or None."""
    ends = [text.find(s) + len(s) for s in stops if s and s in text]
    return min(ends) if ends else None


def _check_params(params: SamplingParams) -> None:
    if params.temperature < 0:
        raise LLMError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise LLMError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise LLMError(f"top_k must be >= 0 (0 = off), got {params.top_k}")
    if params.top_logprobs < 0:
        raise LLMError(f"top_logprobs must be >= 0, got {params.top_logprobs}")
    if params.max_tokens < 1 or params.n < 1:
        raise LLMError(f"max_tokens and n must be >= 1, got max_tokens={params.max_tokens}, n={params.n}")
