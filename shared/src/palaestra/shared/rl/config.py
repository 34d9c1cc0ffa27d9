"""Configs of the RL trainer (`TrainConfig` and its sections); the loop is in rl/trainer.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from palaestra.shared.config import ConfigError, JobConfig, value_check
from palaestra.shared.config_checks import registry_kwargs, registry_name
from palaestra.shared.llm.base import LLMConfig, LogprobsMode
from palaestra.shared.llm.lora import LoraConfig
from palaestra.shared.rl.advantages import AdvantageStep
from palaestra.shared.rl.dynamic_sampling import DynamicSamplingConfig
from palaestra.shared.rl.layout import Layout, apply_layout
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.pilot import PilotConfig
from palaestra.shared.rl.sft import SFTOptions
from palaestra.shared.rollout.chat_tokens import ContextView
from palaestra.shared.rollout.engine import RolloutConfig
from palaestra.shared.rollout.vllm_weight_sync import WeightSync


@dataclass
class EnvSpec:
    """One environment of the task mixture."""

    name: str = field(default="task", metadata=registry_name("palaestra.shared.rollout.env:ENVS"))
    """Registered env (`ENVS`)."""
    kwargs: dict[str, Any] = field(default_factory=dict, metadata=registry_kwargs("name"))
    """Constructor arguments of the env."""
    weight: float = 1.0
    """Share of the tasks drawn from this env."""


class LRSchedule(StrEnum):
    """The learning rate after warmup (rl/optim.py)."""

    constant = "constant"
    cosine = "cosine"


class TaskSampling(StrEnum):
    """How each step's tasks are drawn (rl/task_sampling.py)."""

    replacement = "replacement"
    epochs = "epochs"


class EpochMixture(StrEnum):
    """Each env's share of an epoch under ``task_sampling: epochs`` (rl/task_sampling.py)."""

    counts = "counts"
    weights = "weights"


class ScheduleUnit(StrEnum):
    """What the learning-rate schedule counts (rl/optim.py)."""

    rl_step = "rl_step"
    optimizer_step = "optimizer_step"


@dataclass
class OptimConfig:
    """The learner's AdamW and its learning-rate schedule (rl/optim.py), a function of the RL or optimizer step."""

    lr: float = 1e-6
    """Peak learning rate."""
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW's (beta1, beta2); torch's default. MARS: (0.9, 0.95)."""
    max_grad_norm: float = 1.0
    """Gradient clipping (0: off)."""
    warmup_steps: int = 0
    """Steps (of ``schedule_unit``) of linear warmup from 0: step s < warmup_steps updates at
    lr * s / warmup_steps, so the first update has lr 0 (as HF's and Megatron's warmup schedulers). MARS: 10."""
    schedule: LRSchedule = LRSchedule.constant
    """After warmup: `constant` at lr, or `cosine` from lr toward min_lr over the run's steps (MARS)."""
    min_lr: float = 0.0
    """The cosine schedule's floor (MARS: 0, ROLL's default)."""
    schedule_unit: ScheduleUnit = ScheduleUnit.rl_step
    """What warmup_steps and the cosine's length count: `rl_step` (the rate set once per RL step) or
    `optimizer_step` (set before every optimizer step; the cosine spans the run's optimizer steps and ends
    exactly at the last one, as ROLL's scheduler, MARS's trainer)."""

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr <= self.lr:
            raise ConfigError(f"optim.min_lr must be in [0, optim.lr={self.lr}], got {self.min_lr}")


@dataclass
class WorkersConfig:
    num_workers: int = 0
    """Ray rollout workers, each with a model replica (0: rollouts in the learner's process)."""
    num_cpus: float = 1
    num_gpus: float = 0
    llm: LLMConfig | None = None
    """The workers' backend (e.g. vllm on GPU nodes); None: the learner's `llm`."""
    weight_sync: WeightSync = field(
        default=WeightSync.object_store,
        metadata=value_check("palaestra.shared.rollout.vllm_weight_sync:check_weight_sync"),
    )
    """How the workers get the learner's weights after each step: object_store (one copy in Ray's object
    store; CPU, any backend) | nccl (vLLM workers on GPUs: one batched NCCL broadcast from the trainer's
    GPU, rollout/vllm_weight_sync.py; not run on a GPU yet)."""


class LearnerStrategy(StrEnum):
    """How the sharded learner splits the model over its ranks (rl/distributed.py)."""

    fsdp = "fsdp"
    ddp = "ddp"


class ComputeDType(StrEnum):
    """The learner's compute dtype (its weights stay float32)."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


LOGIT_CHUNK_ELEMENTS = 2**23
"""Logits rl/logprobs.py computes at once: positions x vocabulary (32 MiB in float32; 55 positions of a 151k
vocabulary). Here, not there, so that `palaestra plan` (plan_memory.py) reads it without torch."""


@dataclass
class LearnerConfig:
    """Where the learner runs: this process (world size 1) or N Ray actors forming one torch.distributed group."""

    world_size: int = 1
    """Learner processes (1: the model in the trainer's own process; N > 1: rl/distributed.py)."""
    strategy: LearnerStrategy = LearnerStrategy.fsdp
    """fsdp (FSDP2 ``fully_shard`` per decoder layer, then the root) | ddp (a full replica per rank)."""
    num_cpus: float = 1
    """CPUs per learner rank (Ray resource request)."""
    num_gpus: float = 0
    """GPUs per learner rank (1 on GPU nodes: NCCL then; 0: CPU and gloo)."""
    micro_batch_tokens: int = 0
    """Token budget of a micro-batch (rows x longest row, padding included): each minibatch is split into
    micro-batches of at most this many tokens whose gradients add up to one optimizer step; old/reference
    log-prob scoring uses the same budget (0: no split)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward (the model's own activation
    checkpointing, non-reentrant): the same gradients for far less activation memory."""
    shared_prompt: bool = True
    """Run each distinct prompt of a micro-batch through the decoder once for all its rows (a group's
    samples) and only the rows' own tokens on top of its cache, in the update and in log-prob scoring
    (rl/shared_prompt.py): the same log-probs and gradients up to float rounding. False: one forward over
    the whole rows. A model that cannot share (sliding-window layers, no cache) runs that, with a warning;
    so does the sharded learner with strategy fsdp (its ranks must make the same decoder calls)."""
    compute_dtype: ComputeDType = ComputeDType.auto
    """auto (bfloat16 on GPU, float32 on CPU) | float32 | bfloat16. The learner's weights stay float32
    (the master copy the optimizer updates); bfloat16 runs forward and backward under autocast."""
    optimizer_offload: bool = field(
        default=False, metadata=value_check("palaestra.shared.rl.config:check_optimizer_offload")
    )
    """Keep AdamW's state in CPU memory and step it there (rl/optim_offload.py; the in-process learner only,
    world size 1): 8 bytes per parameter off the GPU for two host copies of the weights per optimizer step."""


COMPUTE_DTYPES = tuple(ComputeDType)


def check_optimizer_offload(value: bool, owner: LearnerConfig) -> str | None:
    """The offloaded AdamW is the in-process learner's; the sharded ranks keep their own shards' state."""
    if value and owner.world_size > 1:
        return f"the in-process learner's only (learner.world_size 1); got world_size {owner.world_size}"
    return None


def check_learner_llm(llm: LLMConfig, owner: TrainConfig) -> str | None:
    """The learner trains a local model in float32 master weights: transformers backend, dtype auto or float32."""
    if llm.backend != "transformers":
        return (
            f"backend '{llm.backend}': the learner trains a local model, so the backend must be 'transformers' "
            "(rollouts on another backend: workers.llm)"
        )
    if llm.dtype not in ("auto", "float32"):
        return (
            f"dtype '{llm.dtype}': the learner keeps float32 master weights; "
            "set learner.compute_dtype=bfloat16 for bfloat16 compute"
        )
    return None


def learner_dtypes(learner: LearnerConfig, llm: LLMConfig, device_type: str) -> str:
    """The learner's compute dtype on `device_type` (cpu | cuda); a clear error for a setting that cannot hold."""
    if learner.compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(
            f"learner.compute_dtype: unknown dtype {learner.compute_dtype!r}; known: {', '.join(COMPUTE_DTYPES)}"
        )
    if llm.dtype not in ("auto", "float32"):
        raise ConfigError(
            f"llm.dtype: the learner keeps float32 master weights (got {llm.dtype!r}); "
            "set learner.compute_dtype=bfloat16 for bfloat16 compute"
        )
    dtype = learner.compute_dtype
    if dtype == "auto":
        return "bfloat16" if device_type == "cuda" else "float32"
    if dtype == "bfloat16" and device_type != "cuda":
        raise ConfigError(f"learner.compute_dtype: bfloat16 needs a GPU (the learner is on {device_type})")
    return dtype


@dataclass
class EvalConfig:
    """How the trainer's evaluations sample (the default one and a package's eval hook): on the rollout workers,
    with the training rollout's settings wherever a field is left unset (None). Resolved in
    `TrainConfig.__post_init__`, so the logged config holds the values that ran."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens_per_turn: int | None = None
    max_context_tokens: int | None = None
    """Prompt + response tokens per conversation (unset: ``rollout.max_context_tokens``, e.g. MARS's 32,768)."""
    max_turns: int | None = None
    stop: list[str] | None = None
    response_prefix: str | None = None
    group_size: int | None = None
    """Episodes per evaluation task (unset: ``rollout.group_size``)."""
    context: ContextView | None = None
    """What a later turn's prompt holds (unset: ``rollout.context``): ``generated``, the tokens sampled so far;
    ``template``, the conversation re-rendered by the model's template, as a chat endpoint shows it (BFCL's
    runner, a served model). The trainer's evaluation tags its run with the view (``palaestra.eval_context``)."""

    def inherit(self, rollout: RolloutConfig) -> None:
        """Fill every unset field from the training rollout's settings."""
        for name in EVAL_SAMPLING:
            if getattr(self, name) is None:
                value = getattr(rollout, name)
                setattr(self, name, list(value) if isinstance(value, list) else value)

    def rollout_config(self, rollout: RolloutConfig) -> RolloutConfig:
        """The training rollout's settings with this section's set fields in their place."""
        chosen = {name: getattr(self, name) for name in EVAL_SAMPLING if getattr(self, name) is not None}
        return dataclasses.replace(rollout, **chosen)


EVAL_SAMPLING = tuple(f.name for f in dataclasses.fields(EvalConfig))
"""The fields an `EvalConfig` shares with `RolloutConfig` (a subclass's own fields are not among them)."""


@dataclass
class PolicySpec:
    """One of several policies trained in one run (rl/policies.py): the agents it plays and what it has of its
    own; every unset section is the run's (``llm``, ``lora``, ``optim``, ``learner``)."""

    agents: list[str] = field(default_factory=list)
    """The agents (mars seats ``player_0``/``player_1``, a multi-agent system's roles) whose turns this policy
    samples and trains on; empty: every agent no other policy names (at most one policy may leave it empty)."""
    llm: LLMConfig | None = None
    """Its own model (the transformers backend); None: the run's ``llm`` (a model of its own all the same)."""
    lora: LoraConfig | None = None
    optim: OptimConfig | None = None
    learner: LearnerConfig | None = None


@dataclass
class TrainConfig(JobConfig):
    """RL fine-tuning of an LLM policy on text environments (GRPO, EGPO, MARS and mixtures)."""

    llm: LLMConfig = field(
        default_factory=LLMConfig, metadata=value_check("palaestra.shared.rl.config:check_learner_llm")
    )
    """The policy (and the learner's model: its backend must be transformers)."""
    envs: list[EnvSpec] = field(default_factory=lambda: [EnvSpec()])
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    advantages: list[AdvantageStep] = field(
        default_factory=lambda: [AdvantageStep("grpo")],
        metadata=value_check("palaestra.shared.rl.advantages:check_chain"),
    )
    """The advantage pipeline (rl/advantages.py): a step that makes values from rewards, then transforms."""
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft_warmup: SFTOptions = field(default_factory=SFTOptions)
    """An SFT stage on the same model before RL (``sft_warmup.steps`` 0: none)."""
    steps: int = field(default=10, metadata=value_check("palaestra.shared.config:check_non_negative"))
    """RL steps (one rollout + its updates each)."""
    tasks_per_step: int = 8
    """Tasks per step; each is played ``rollout.group_size`` times."""
    task_seeds: int = 0
    """Draw reset seeds from range(task_seeds) (0: any 31-bit seed)."""
    ppo_epochs: int = 1
    minibatch_size: int = 0
    """Trajectories per optimizer step (0: the whole batch in one step)."""
    checkpoint_every: int = 0
    """Save every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    resume: bool = False
    """Continue from the newest checkpoint in ``output_dir/checkpoints``."""
    log_samples: int = 4
    """Decoded responses logged as text per step."""
    eval_tasks: int = 0
    """Tasks (reset seeds 0..eval_tasks-1, envs in turn) played ``rollout.group_size`` times by the default
    evaluation: ``eval/reward_mean`` with a 95% confidence interval (0: none, unless a package's job
    supplies its own eval hook)."""
    eval_every: int = 0
    """Evaluate every N steps (0: only before and after training)."""
    eval_before: bool = True
    """Evaluate before the first step (after the warm start): the starting point."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """How evaluations sample: unset fields are the rollout's (context length, sampling, response prefix)."""
    task_sampling: TaskSampling = TaskSampling.replacement
    """replacement (each task an env by weight and a random reset seed) | epochs (every task of every env once
    per epoch, reshuffled per epoch, as verl's dataloader; rl/task_sampling.py)."""
    policies: dict[str, PolicySpec] = field(
        default_factory=dict, metadata=value_check("palaestra.shared.rl.policy_configs:check_policies")
    )
    """Several policies trained together, by name (rl/policies.py): each plays its ``agents``, with its own
    weights, optimizer, learner, reference, advantages (its own rows), metrics (``policy/<name>/...``) and
    checkpoint. Empty: one policy plays every agent (self-play)."""
    epochs: int = field(default=0, metadata=value_check("palaestra.shared.rl.config:check_epochs"))
    """With ``task_sampling: epochs``, > 0: the run is ceil(epochs x tasks / tasks_per_step) steps instead of
    ``steps`` (the EGPO paper: 5). 0: ``steps`` steps."""
    dynamic_sampling: DynamicSamplingConfig = field(
        default_factory=DynamicSamplingConfig,
        metadata=value_check("palaestra.shared.rl.dynamic_sampling:check_dynamic_sampling"),
    )
    """DAPO's dynamic sampling (rl/dynamic_sampling.py): drop the groups whose rewards are all equal and draw
    more tasks until the step has ``tasks_per_step`` mixed groups or ``max_extra_draws`` extra draws. Off."""
    layout: Layout = Layout.custom
    """A named GPU layout (rl/layout.py): custom (the config's own placement keys) | node8_split |
    node8_colocated | gpu1_colocated; a named one sets the learner's, the workers' and the trainer's placement
    (`palaestra plan` prints what each GPU holds)."""
    epoch_mixture: EpochMixture = field(
        default=EpochMixture.counts, metadata=value_check("palaestra.shared.rl.task_sampling:check_epoch_mixture")
    )
    """With ``task_sampling: epochs``: counts (an env's share of an epoch is its task count's; unequal env weights
    are refused) | weights (its share is its weight's, within 1/N; rl/task_sampling.py)."""
    pilot: PilotConfig = field(
        default_factory=PilotConfig, metadata=value_check("palaestra.shared.rl.pilot:check_pilot")
    )
    """A pilot pass before training (rl/pilot.py): the starting policy plays each candidate task ``samples``
    times and only the tasks with mixed rewards are trained on. Off."""

    def __post_init__(self) -> None:
        apply_layout(self)  # before the checks below: they read the placement it sets
        # resolved here, before the config is logged: what MLflow's config.yaml holds is what runs
        self.eval.inherit(self.rollout)
        if self.loss.reduction == "dr_grpo" and not self.loss.max_len:
            self.loss.max_len = self.rollout.max_tokens_per_turn
        if self.loss.behaviour_correction != "off" and (problem := self._correction_problem()):
            raise ConfigError(
                f"loss.behaviour_correction compares the learner's log-probs with the sampler's: {problem}"
            )

    def _correction_problem(self) -> str | None:
        """Whether the learner scores the distribution the rollout client logs (``llm.logprobs_mode``): processed,
        the tempered, truncated one (the learner at the rollout's temperature); raw, the model's own (at 1.0, and
        only right when the rollout samples from it: temperature 1, no top-k / top-p)."""
        on_workers = self.workers.llm if self.workers.num_workers > 0 else None  # the rollout client's config
        llm, key = (on_workers, "workers.llm") if on_workers is not None else (self.llm, "llm")
        r, chosen = self.rollout, self.loss.logprob_temperature
        if llm.logprobs_mode == LogprobsMode.processed:
            if chosen is None or chosen == r.temperature:
                return None
            return (
                f"{key}.logprobs_mode=processed logs them at rollout.temperature={r.temperature}, but the learner "
                f"scores at loss.logprob_temperature={chosen}: leave it unset"
            )
        if r.temperature != 1.0 or r.top_k or r.top_p != 1.0:
            return (
                f"{key}.logprobs_mode=raw logs the untempered model, but the rollout samples at temperature "
                f"{r.temperature}, top_k {r.top_k}, top_p {r.top_p}: set {key}.logprobs_mode=processed"
            )
        if chosen is not None and chosen != 1.0:  # None: the rollout's temperature, 1 here
            return f"the sampler's are untempered: set loss.logprob_temperature=1.0 (got {chosen})"
        return None


def check_epochs(value: int, owner: TrainConfig) -> str | None:
    """Epochs count passes of epoch sampling; with the other draw they would be silently ignored."""
    if value < 0:
        return f"must be >= 0, got {value}"
    if value and owner.task_sampling != TaskSampling.epochs:
        return f"{value} epochs need task_sampling: epochs (got {owner.task_sampling})"
    return None
