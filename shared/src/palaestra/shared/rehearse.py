"""``palaestra rehearse CONFIG``: a paper config end to end on CPU, through its own code path, at small sizes.

A rehearsal loads the paper config's YAML, lets the job's package scale it (`REHEARSALS`, keyed by job name:
a package registers a `Rehearsal` for each of its jobs; a ``pipeline`` rehearses each stage with its job's),
prints what was scaled and what was kept (key, paper value, rehearsal value), runs it with `run_job` as
``palaestra run`` would, and checks what a lab needs to trust the paper run: the job completed, the MLflow
metrics it logged, and the package's own reload of what it wrote (a checkpoint, a policy, a dataset).

What a rehearsal changes, and nothing else:

- the model: a Qwen3-architecture model built in code (`tiny`'s weights) saved as a local HF directory with a
  chat template that behaves as Qwen3's (``llm/qwen3_style.jinja``: earlier turns lose their ``<think>``), so
  multi-turn rendering meets the paper model's template;
- sizes: steps, batches, sequence lengths, episodes, timesteps (each package's `Rehearsal.scale`);
- placement: the learner at world size 2 (gloo; the config's strategy kept), rollout workers on CPU (vLLM where
  it is importable, with the config's weight sync; else the transformers backend), a local Ray instance;
- data that needs the network: local files in the same format, or a local OpenAI-compatible server
  (``palaestra serve`` over the rehearsal model) in place of a served LLM.

`RehearsalContext` carries these choices to the packages; the core never imports a package.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError, read_yaml
from palaestra.shared.registry import Registry

QWEN3_STYLE_TEMPLATE = Path(__file__).parent / "llm" / "qwen3_style.jinja"
REHEARSAL_WORLD_SIZE = 2


@dataclass
class RehearsalContext:
    """What a package's scaler may use: where to write, which model, which engines this machine has."""

    workdir: Path
    """The rehearsal's own directory (outputs, MLflow store, stubbed data)."""
    model: str
    """A local HF directory: the small Qwen3-architecture model with the Qwen3-style chat template."""
    vllm: bool
    """vLLM is importable here: rollout workers run it (on CPU)."""
    base_url: str | None = None
    """A local OpenAI-compatible server over `model`, for configs that call a served LLM (set by `serve_model`)."""
    world_size: int = REHEARSAL_WORLD_SIZE
    """The sharded learner's ranks."""

    def trainer_placement(self) -> dict[str, Any]:
        """The keys every RL trainer's rehearsal sets alike: the small model on CPU, the learner at `world_size`
        ranks of one CPU, one CPU rollout worker (vLLM where importable) in float32."""
        return {
            "layout": "custom",  # the paper's named GPU layout (rl/layout.py) gives way to these keys
            "llm.model": self.model,
            "llm.device": "cpu",
            "learner.world_size": self.world_size,
            "learner.num_gpus": 0,
            "learner.num_cpus": 1,
            "workers.num_workers": 1,
            "workers.num_gpus": 0,
            "workers.num_cpus": 1,
            "workers.llm.backend": "vllm" if self.vllm else "transformers",
            "workers.llm.model": self.model,
            "workers.llm.dtype": "float32",
        }


@dataclass(frozen=True)
class Rehearsal:
    """How a job rehearses: `scale` returns ``{dotted key: value}`` to set in its config mapping (a stage's, in a
    pipeline); `check` gets the resolved config and the job's summary after the run and returns a one-line
    account of what it reloaded (raise on failure); `served_llm` says whether the config calls a served LLM."""

    scale: Callable[[dict[str, Any], RehearsalContext], dict[str, Any]]
    check: Callable[[Any, dict[str, Any]], str] | None = None
    served_llm: Callable[[dict[str, Any]], bool] = lambda data: False


REHEARSALS: Registry[Rehearsal] = Registry("rehearsal")
"""Job name -> `Rehearsal`; packages fill it when their jobs load (the ``palaestra.jobs`` entry points)."""


@dataclass
class RehearsalResult:
    config: Any
    summary: dict[str, Any]
    table: list[tuple[str, str, str]]
    """(key, paper value, rehearsal value) for every key the paper config or the rehearsal sets."""
    scaled: list[str]
    """The keys whose value the rehearsal changed (or added)."""
    checks: list[str] = field(default_factory=list)
    wall_s: float = 0.0


# ---- scaling ---------------------------------------------------------------------------------------------------


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``data[a][b][c] = value`` for key ``a.b.c`` (missing mappings created; a list index may be a number)."""
    parts = key.split(".")
    node: Any = data
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
            continue
        if not isinstance(node.get(part), dict | list):
            node[part] = {}
        node = node[part]
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": 1}`` from ``{"a": {"b": 1}}``; lists of mappings by index, other lists as values."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        out = {}
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: data}


def scale_config(data: dict[str, Any], ctx: RehearsalContext) -> dict[str, Any]:
    """The rehearsal's config mapping: each job (each stage of a pipeline) scaled by its package's rehearsal."""
    scaled = copy.deepcopy(data)
    job_name = str(data.get("job"))
    common = {
        "output_dir": str(ctx.workdir / "outputs"),
        "tracking.uri": f"sqlite:///{ctx.workdir / 'mlflow.db'}",
        "tracking.artifact_root": str(ctx.workdir / "artifacts"),
        "torch_threads": 1,
        "cluster.address": None,
        "cluster.num_gpus": 0,
        "cluster.num_cpus": 4,
        "cluster.object_store_mb": 128,
    }
    if job_name == "pipeline":
        for stage in scaled.get("stages", {}).values():
            stage_job = str(stage.get("job"))
            for key, value in _rehearsal(stage_job).scale(stage, ctx).items():
                set_dotted(stage, key, value)
            if isinstance(stage.get("cluster"), dict):  # a stage's own cluster is the local instance too
                stage["cluster"] = {k.split(".", 1)[1]: v for k, v in common.items() if k.startswith("cluster.")}
    else:
        for key, value in _rehearsal(job_name).scale(scaled, ctx).items():
            set_dotted(scaled, key, value)
    for key, value in common.items():
        set_dotted(scaled, key, value)
    return scaled


def _rehearsal(job_name: str) -> Rehearsal:
    from palaestra.shared.jobs import JOBS

    JOBS.get(job_name)  # loads the job's package, whose import registers its rehearsal
    if job_name not in REHEARSALS:
        raise ConfigError(f"job '{job_name}' has no rehearsal (jobs with one: {', '.join(REHEARSALS.names())})")
    return REHEARSALS.get(job_name)


def served_llm(data: dict[str, Any]) -> bool:
    """Whether the config (or a stage of it) calls a served LLM, so the rehearsal starts a local server."""
    stages = list(data.get("stages", {}).values()) if data.get("job") == "pipeline" else [data]
    return any(_rehearsal(str(s.get("job"))).served_llm(s) for s in stages)


def compare(paper: dict[str, Any], rehearsal: dict[str, Any]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(table of key / paper value / rehearsal value over every key either sets, keys that differ)."""
    before, after = flatten(paper), flatten(rehearsal)
    keys = list(before) + [k for k in after if k not in before]
    table = [(k, _show(before.get(k, "(default)")), _show(after.get(k, "(removed)"))) for k in keys]
    changed = [k for k in keys if before.get(k, object()) != after.get(k, object())]
    return table, changed


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_table(table: list[tuple[str, str, str]], scaled: list[str]) -> str:
    """Scaled keys first, then kept ones; one line each."""
    rows = [("key", "paper", "rehearsal", "")]
    rows += [(k, p, r, "scaled") for k, p, r in table if k in scaled]
    rows += [(k, p, r, "kept") for k, p, r in table if k not in scaled]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}".rstrip() for row in rows
    )


# ---- the model and the server ----------------------------------------------------------------------------------


def rehearsal_model(workdir: Path, seed: int = 0) -> str:
    """`tiny` (a Qwen3-architecture model) saved under `workdir` with the Qwen3-style chat template."""
    from palaestra.shared.llm.tiny import tiny_path

    path = workdir / "model"
    if not (path / "config.json").exists():
        shutil.copytree(tiny_path(seed), path, dirs_exist_ok=True)
        (path / "chat_template.jinja").write_text(QWEN3_STYLE_TEMPLATE.read_text())
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config.pop("chat_template", None)  # the .jinja file beside it is the template
        config_file.write_text(json.dumps(config, indent=2))
    return str(path)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


@contextlib.contextmanager
def serve_model(model: str, workdir: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """``palaestra serve MODEL`` on a free local port for the duration; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(workdir / "serve.log", "w")  # noqa: SIM115  (closed below)
    cmd = [sys.executable, "-m", "palaestra.shared.cli", "serve", model, "--port", str(port), "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_for(base_url, proc, timeout_s, workdir / "serve.log")
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _wait_for(base_url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the rehearsal's model server exited ({proc.returncode}); see {log}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{base_url}/models", timeout=2):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the rehearsal's model server did not answer within {timeout_s:.0f} s; see {log}")


# ---- running ---------------------------------------------------------------------------------------------------


def rehearse(config: str | Path, workdir: str | Path, overrides: list[str] | None = None) -> RehearsalResult:
    """Scale `config`, print the table, run it, check it (the package's reload); raise on any failure."""
    from palaestra.shared.jobs import load_config, run_job

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    from palaestra.shared.matrix import split_matrix

    paper, matrix = split_matrix(read_yaml(config))
    if matrix is not None:  # every combination runs the same job: rehearse one
        print(f"{config}: a matrix over {', '.join(matrix.axes)}; the rehearsal runs one combination")
    if paper.get("job") == "pipeline":
        paper.setdefault("config_dir", str(Path(config).parent))
    ctx = RehearsalContext(workdir=workdir, model=rehearsal_model(workdir), vllm=vllm_available())
    if ctx.vllm:  # vLLM on CPU sizes its KV cache from this (GiB); the small model needs little
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        if served_llm(paper):
            ctx.base_url = stack.enter_context(serve_model(ctx.model, workdir))
        data = scale_config(paper, ctx)
        table, scaled = compare(paper, data)
        print(f"rehearsal of {config} (vLLM workers: {'yes' if ctx.vllm else 'no'})\n{format_table(table, scaled)}\n")
        cfg = load_config(data, overrides or [])
        summary = run_job(cfg)
    checks = _checks(cfg, summary)
    wall = time.monotonic() - start
    for line in checks:
        print(f"check: {line}")
    print(f"rehearsal of {config}: done in {wall:.0f} s; {len(scaled)} keys scaled, {len(table) - len(scaled)} kept")
    return RehearsalResult(cfg, summary, table, scaled, checks, wall)


def _checks(cfg: Any, summary: dict[str, Any]) -> list[str]:
    from palaestra.shared.pipeline import stage_configs

    if cfg.job != "pipeline":
        check = _rehearsal(cfg.job).check
        return [f"{cfg.job}: {check(cfg, summary)}"] if check else []
    lines = []
    for name, stage in stage_configs(cfg).items():
        check = _rehearsal(stage.job).check
        if check:
            own = {k.split("/", 1)[1]: v for k, v in summary.items() if k.startswith(f"{name}/")}
            lines.append(f"{name}: {check(stage, own)}")
    return lines


def reload_train_checkpoint(cfg: Any, summary: dict[str, Any]) -> str:
    """An RL run's check: its last checkpoint (manifest verified) loads into a fresh model of its architecture."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from palaestra.shared.rl import checkpoint

    last = checkpoint.latest(Path(cfg.output_dir) / "checkpoints")
    if last is None:
        raise AssertionError(f"no checkpoint under {cfg.output_dir}/checkpoints")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(last))
    checkpoint.verify(last)
    checkpoint.load_weights(last, model)
    return f"checkpoint {last.name} reloaded (manifest verified, {sum(p.numel() for p in model.parameters())} weights)"


def main(config: str, workdir: str | None, overrides: list[str]) -> int:
    """The CLI's ``rehearse`` command."""
    where = Path(workdir) if workdir else Path("outputs") / "rehearsals" / Path(config).stem
    rehearse(config, where, overrides)
    return 0
