"""Named GPU layouts (rl/layout.py), vLLM's sleep-mode orchestration (llm/sleep_mode.py) against a recording
engine, and the bf16 KL reference (rl/policy.py `reference_copy`) against the float32 path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from palaestra.shared.cli import main
from palaestra.shared.config import ConfigError
from palaestra.shared.llm.base import LLMError
from palaestra.shared.llm.sleep_mode import Colocation, SleepingEngine
from palaestra.shared.plan_memory import GB, KNOWN_ARCHITECTURES, LearnerShape, learner_memory
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.layout import LAYOUTS, Layout
from palaestra.shared.testing import tiny_learner

ROOT = Path(__file__).resolve().parents[2]
EGPO = ROOT / "experiments/egpo/qwen3_4b_bfcl.yaml"


def _resolve(*overrides: str) -> TrainConfig:
    from palaestra.shared.jobs import load_config

    cfg = load_config(EGPO, overrides)
    assert isinstance(cfg, TrainConfig)
    return cfg


def test_a_named_layout_sets_the_placement_and_one_key_picks_another():
    colocated = _resolve()
    assert colocated.layout == Layout.node8_colocated
    assert (colocated.learner.world_size, colocated.learner.num_gpus) == (8, 0.51)
    assert (colocated.workers.num_workers, colocated.workers.num_gpus) == (8, 0.49)
    # two ranks (0.51 each) or a rank and... never two ranks on one GPU; a rank and an engine fill one exactly
    assert 2 * 0.51 > 1 and 0.51 + 0.49 == 1
    assert colocated.workers.llm.sleep_mode and colocated.llm.device == "cpu"
    split = _resolve("layout=node8_split")
    assert (split.learner.world_size, split.workers.num_workers, split.llm.device) == (4, 3, "cuda:7")
    assert not split.workers.llm.sleep_mode
    one = _resolve("layout=gpu1_colocated")
    assert (one.learner.world_size, one.workers.num_workers, one.cluster.num_gpus) == (1, 1, 1)
    assert sum(s.gpus for s in LAYOUTS.values()) == 8 + 8 + 1 + 1


def test_bad_layout_values_are_one_line_errors(capsys):
    assert main(["run", str(EGPO), "layout=one_gpu", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "layout" in err and "gpu1_colocated" in err and len(err.splitlines()) == 1
    with pytest.raises(ConfigError, match="learner.world_size=2: layout node8_colocated sets it to 8"):
        _resolve("learner.world_size=2")
    with pytest.raises(ConfigError, match="rollout.max_staleness=0"):
        _resolve("rollout.max_staleness=1")
    # negative control: custom keeps the config's own keys
    assert _resolve("layout=custom", "learner.world_size=2").learner.world_size == 2


def test_plan_prints_each_layout_with_both_gpu_sizes(capsys):
    assert main(["plan", str(EGPO)]) == 0
    out = capsys.readouterr().out
    p = KNOWN_ARCHITECTURES["Qwen/Qwen3-4B-Instruct-2507"].params()
    # per rank: float32 weights and gradients, AdamW's two float32 moments over 8, the bf16 reference over 8
    assert f"weights {4 * p / 8 / GB:6.2f}, gradients {4 * p / 8 / GB:6.2f}, AdamW {8 * p / 8 / GB:6.2f}" in out
    assert f"reference {2 * p / 8 / GB:6.2f}" in out
    # vLLM awake at 0.65 of an 80 GB GPU: 52 GB; asleep 1 GB: the sleep mode frees 51. Through the rollout the rank
    # keeps its weights, AdamW's moments, the reference and the 3 GB reserve: 10.04 + 52
    kept = (4 + 8 + 2) * p / 8 + 3e9
    assert "vLLM awake  52.00" in out and "sleep mode frees  51.00" in out
    assert f"rollout phase {(kept + 52e9) / GB:6.2f}" in out
    assert "layout node8_colocated: 80 GB GPUs fit, 141 GB GPUs fit" in out
    # vLLM refuses to start without one whole sequence of the model's context (262,144 tokens for this model)
    from palaestra.shared.plan import plan

    cfg = _resolve()
    cfg.workers.llm.gpu_memory_utilization = 0.5  # 29.96 GB of KV cache: 203k tokens
    text, fits = plan(cfg)
    assert not fits and "80 GB GPU: vLLM awake  40.00" in text and "262144 tokens" in text
    assert main(["plan", str(EGPO), "layout=gpu1_colocated"]) == 1  # 80 GB: AdamW's state alone is 32 GB
    out = capsys.readouterr().out
    assert "80 GB GPUs DO NOT FIT, 141 GB GPUs fit" in out
    assert main(["plan", str(EGPO), "layout=gpu1_colocated", "--gpu-gb", "141"]) == 0
    capsys.readouterr()


class RecordingEngine:
    """A stand-in for `vllm.LLM`'s sleep API: records every call."""

    def __init__(self, log: list):
        self.log = log

    def sleep(self, level: int) -> None:
        self.log.append(("sleep", level))

    def wake_up(self, tags=None) -> None:
        self.log.append(("wake_up", tuple(tags) if tags else None))


class FakeClient(SleepingEngine):
    def __init__(self, log: list):
        self._sleep_engine, self.log = RecordingEngine(log), log

    def generate(self) -> str:
        self.check_awake()
        self.log.append(("generate",))
        return "ok"

    def load_weights(self) -> None:
        self.log.append(("load_weights",))


def test_colocation_orders_sleep_update_wake_sync_and_nothing_generates_asleep():
    log: list = []
    engines = [FakeClient(log), FakeClient(log)]
    colocation = Colocation(lambda method, *args: [getattr(e, method)(*args) for e in engines])
    for _ in range(2):  # two RL steps
        for e in engines:
            e.generate()
        colocation.sleep()
        with pytest.raises(LLMError, match="asleep"):
            engines[0].generate()
        log.append(("update",))
        colocation.wake(lambda: [e.load_weights() for e in engines])
    step = [
        ("generate",), ("generate",),
        ("sleep", 1), ("sleep", 1),
        ("update",),
        ("wake_up", ("weights",)), ("wake_up", ("weights",)),
        ("load_weights",), ("load_weights",),
        ("wake_up", ("kv_cache",)), ("wake_up", ("kv_cache",)),
    ]  # fmt: skip
    assert log == step + step
    # between the two wake-ups the engine is still asleep (its KV cache): generating there would fail
    e = FakeClient([])
    e.sleep()
    e.wake_up(["weights"])
    with pytest.raises(LLMError, match="kv_cache"):
        e.generate()
    e.wake_up(["kv_cache"])
    assert e.generate() == "ok"
    # negative control: without sleeping engines, wake only syncs
    calls: list = []
    Colocation().sleep()
    Colocation().wake(lambda: calls.append("sync"))
    assert calls == ["sync"]


def test_the_bf16_reference_matches_the_float32_one_within_bf16_rounding():
    from palaestra.shared.rl.logprobs import token_logprobs_and_entropy
    from palaestra.shared.rl.policy import reference_copy, reference_dtype

    torch.manual_seed(0)
    model = tiny_learner().model
    ref = reference_copy(model, reference_dtype(torch.bfloat16))
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in ref.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the policy is untouched
    # memory held: 2 bytes per parameter, what plan_memory counts for the reference with bf16 compute
    params = sum(p.numel() for p in model.parameters())
    held = sum(p.numel() * p.element_size() for p in ref.parameters())
    shape = LearnerShape(1, "fsdp", 2, 4, 64, False, True)
    assert held == 2 * params and learner_memory(_arch_of(model), shape)["reference"] == held
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        fp32, _ = token_logprobs_and_entropy(model, ids, mask, with_entropy=False)
        bf16, _ = token_logprobs_and_entropy(ref, ids, mask, with_entropy=False)
        gap = (fp32 - bf16.float()).abs().max().item()
        # negative control: a reference off by one bf16 step's worth of noise on every weight differs more
        noisy = reference_copy(model, torch.float32)
        for p in noisy.parameters():
            p.add_(torch.randn_like(p) * p.abs().mean() * 0.05)
        off, _ = token_logprobs_and_entropy(noisy, ids, mask, with_entropy=False)
    assert 0 < gap < 0.1
    assert (fp32 - off).abs().max().item() > 2 * gap


def _arch_of(model):
    from palaestra.shared.plan_memory import arch_from_hf_config

    return arch_from_hf_config(model.config.to_dict())


def test_the_trainer_sleeps_the_engines_before_the_update_and_syncs_between_the_wake_ups(tmp_path):
    """`Trainer.train_step` on `tiny` with a recording colocation: every engine call is in the step's order."""
    from palaestra.shared.rl.loss import LossConfig
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.testing import small_train_config

    trainer = Trainer(small_train_config(tmp_path, "exact_answer", steps=1, loss=LossConfig(kl_coef=0.1)))
    trainer.prepare()
    assert trainer.colocation.call_all is None  # in-process rollouts: nothing sleeps
    log: list = []
    trainer.colocation = Colocation(lambda method, *args: log.append((method, *args)))
    update, sync = trainer.update_policy, trainer.stream.sync
    trainer.update_policy = lambda p, rows: (log.append(("update",)), update(p, rows))[1]  # type: ignore[method-assign]
    trainer.stream.sync = lambda *a: (log.append(("sync",)), sync(*a))[1]  # type: ignore[method-assign]
    # the in-process rollout runs before the sleep: it records its generate calls through the engine
    run = trainer.rollouts.run
    trainer.rollouts.run = lambda *a, **k: (log.append(("rollout",)), run(*a, **k))[1]  # type: ignore[method-assign]
    try:
        trainer.train_step()
    finally:
        trainer.close()
    assert log == [
        ("rollout",), ("sleep", 1), ("update",), ("wake_up", ["weights"]), ("sync",), ("wake_up", ["kv_cache"])
    ]  # fmt: skip
    # the reference in the compute dtype (float32 on CPU): the float32 path as it was
    assert all(p.dtype == torch.float32 for p in trainer.policies[0].ref_model.parameters())


def test_colocation_over_a_ray_pool_calls_each_workers_client():
    from types import SimpleNamespace

    calls: list = []

    class Remote:
        def __init__(self, i: int):
            self.remote = lambda method, *args: calls.append((i, method, *args)) or f"ref{i}"

    got: list = []
    pool = SimpleNamespace(
        llm=SimpleNamespace(sleep_mode=True),
        workers=[SimpleNamespace(weight_transfer=Remote(i)) for i in range(2)],
        ray=SimpleNamespace(get=got.append),
    )
    colocation = Colocation.over(pool)
    colocation.sleep()
    assert calls == [(0, "sleep", 1), (1, "sleep", 1)] and got == [["ref0", "ref1"]]
    # negative control: engines built without sleep mode never sleep
    pool.llm.sleep_mode = False
    assert Colocation.over(pool).call_all is None


def test_a_served_llm_on_one_gpu_is_its_weights_and_the_kv_cache_left():
    from palaestra.shared.plan_layout import served_lines

    lines = served_lines("Qwen/Qwen3-4B-Instruct-2507")
    p = KNOWN_ARCHITECTURES["Qwen/Qwen3-4B-Instruct-2507"].params()
    per_token = 2 * 36 * 8 * 128 * 2  # K and V, layers, kv heads, head dim, bf16
    kv = 0.9 * 80e9 - 2 * p - 2e9  # vLLM's share less its bf16 weights and its activations' overhead
    assert f"80 GB GPU: weights {2 * p / GB:.2f} + KV cache {kv / GB:.2f} GB = {kv / per_token / 1e3:.0f}k" in lines[1]
    assert lines[1].endswith("fits") and lines[2].endswith("fits")
    assert served_lines("Qwen/Qwen3-4B-Instruct-2507", utilization=0.1)[1].endswith("DOES NOT FIT")


@pytest.mark.parametrize("colocated", [True, False])
def test_a_colocated_learner_drops_its_gradients_after_the_update(colocated, monkeypatch):
    """What the plan's rollout phase counts (plan_layout.KEPT): no gradients between updates when colocated."""
    import palaestra.shared.rl.learner as learner_module
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.rl.config import WorkersConfig
    from palaestra.shared.rl.learner import LocalLearner, releases_memory

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    engine = LLMConfig(backend="vllm", sleep_mode=colocated)
    cfg = TrainConfig(job="rl.train", workers=WorkersConfig(num_workers=1, llm=engine))
    assert releases_memory(cfg) is colocated
    monkeypatch.setattr(learner_module, "ppo_update", lambda learner, data: {"loss": 0.0})
    assert LocalLearner(cfg, model, optimizer, torch.float32).update(None) == {"loss": 0.0}  # type: ignore[arg-type]
    assert all((p.grad is None) is colocated for p in model.parameters())
    assert releases_memory(_resolve()) and not releases_memory(_resolve("layout=node8_split"))


def test_gpu_check_paper_step_plans_on_cpu_and_skips_without_cuda(capsys):
    """tools/gpu_check.py --paper-step: the paper config in gpu1_colocated, one step; here only its CPU side."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    mars = str(ROOT / "experiments/mars/qwen3_4b.yaml")
    assert gpu_check.main(["--paper-step", mars, "--plan-only"]) == 0
    out = capsys.readouterr().out
    assert "layout gpu1_colocated: 1 GPU(s)" in out and "141 GB GPUs fit" in out
    if not torch.cuda.is_available():
        assert gpu_check.main(["--paper-step", mars]) == 2
        assert "skipped, no CUDA GPU here" in capsys.readouterr().out


def test_the_offloaded_adamw_steps_as_adamw_bit_for_bit_on_cpu():
    """rl/optim_offload.py against torch's AdamW on the same model: the same weights after every step, the same
    state dict (checkpoints interchangeable), the learning rate set through param_groups as rl/optim.py does."""
    from palaestra.shared.rl.config import OptimConfig
    from palaestra.shared.rl.optim import make_optimizer, set_learning_rate
    from palaestra.shared.rl.optim_offload import OffloadedAdamW

    optim = OptimConfig(lr=1e-2, betas=[0.9, 0.95], weight_decay=0.05)
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    plain, offloaded = make_optimizer(models[0].parameters(), optim), OffloadedAdamW(models[1].parameters(), optim)
    x = torch.randn(8, 6)
    for step in range(4):
        for model, opt in zip(models, (plain, offloaded)):
            opt.zero_grad(set_to_none=True)
            set_learning_rate(opt, 1e-2 / (step + 1))
            model(x).pow(2).mean().backward()
            opt.step()
        assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))
    assert all(p.grad is not None for p in models[1].parameters())
    offloaded.zero_grad()
    assert all(p.grad is None for p in models[1].parameters())
    a, b = plain.state_dict(), offloaded.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(torch.equal(a["state"][i]["exp_avg_sq"], b["state"][i]["exp_avg_sq"]) for i in a["state"])
    # a step without gradients leaves the weights as they are (AdamW skips them; the scratch copies come back)
    before = [p.detach().clone() for p in models[1].parameters()]
    offloaded.step()
    assert all(torch.equal(p, q) for p, q in zip(before, models[1].parameters()))


def test_gpu1_offload_fits_an_80_gb_gpu_and_refuses_a_sharded_learner(capsys):
    assert main(["plan", str(EGPO), "layout=gpu1_offload"]) == 0
    out = capsys.readouterr().out
    p = KNOWN_ARCHITECTURES["Qwen/Qwen3-4B-Instruct-2507"].params()
    assert "optimizer (AdamW)            0.00" in out and f"{16 * p / GB:.2f} GB of host RAM" in out
    assert "layout gpu1_offload: 80 GB GPUs fit, 141 GB GPUs fit" in out
    assert _resolve("layout=gpu1_offload").learner.optimizer_offload
    with pytest.raises(ConfigError, match="learner.optimizer_offload.*world_size 1"):
        _resolve("layout=custom", "learner.world_size=2", "learner.optimizer_offload=true")


def test_a_trainer_step_with_the_offloaded_optimizer_reaches_the_plain_ones_weights(tmp_path):
    """build_policies picks the offloaded AdamW from learner.optimizer_offload; on CPU one RL step lands on the
    same weights as the plain optimizer's, bit for bit."""
    from palaestra.shared.rewards import REWARDS
    from palaestra.shared.rl.config import LearnerConfig
    from palaestra.shared.rl.optim_offload import OffloadedAdamW
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.testing import small_train_config

    if "test_layout_length" not in REWARDS:  # a dense reward: every group has a signal, so the step moves weights
        REWARDS.register("test_layout_length")(lambda sample, completion, **info: len(completion) / 10)
    weights, start = [], None
    for offload in (False, True):
        cfg = small_train_config(tmp_path / str(offload), "test_layout_length", steps=1)
        cfg.learner = LearnerConfig(optimizer_offload=offload)
        with Trainer(cfg) as trainer:
            assert isinstance(trainer.policies[0].optimizer, OffloadedAdamW) is offload
            start = {k: v.clone() for k, v in trainer.policies[0].model.state_dict().items()}
            trainer.train_step()
            weights.append({k: v.clone() for k, v in trainer.policies[0].model.state_dict().items()})
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert start is not None and any(not torch.equal(start[k], weights[1][k]) for k in start)  # it did update
