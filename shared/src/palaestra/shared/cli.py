"""The ``palaestra`` command: ``run`` (``--matrix``: seeds x arms, palaestra.shared.matrix), ``jobs``, ``show``,
``serve``, ``plan``, ``rehearse`` (palaestra.shared.rehearse).

Heavy imports happen inside each command, and jobs are imported only when named, so ``--help``, ``jobs``, and
``show``, ``--dry-run`` and ``plan`` of a job whose module imports no torch, import none
(tests/test_cli_import_time.py).
Options may come anywhere (``palaestra run X.yaml --dry-run seed=1``).
User mistakes (a bad config, an unknown job or backend, a missing model, a
server that does not answer, a missing extra, a checkpoint refused as unsafe, a hub that cannot be reached) and
a run that cannot go on (a non-finite loss) print one line and exit with status
2, also when they happen in a Ray worker.
"""

from __future__ import annotations

import argparse
import math
import pickle
import re
import sys
from pathlib import Path

from palaestra.shared.config import ConfigError
from palaestra.shared.extras import MissingExtraError, missing_extra_message
from palaestra.shared.hub_errors import hub_error_message
from palaestra.shared.registry import UnknownNameError


def _user_errors() -> tuple[type[BaseException], ...]:
    from palaestra.shared.llm.base import LLMError

    errors: tuple[type[BaseException], ...] = (
        ConfigError,
        UnknownNameError,
        LLMError,
        FileNotFoundError,
        MissingExtraError,
    )
    trainer = sys.modules.get("palaestra.shared.rl.trainer")  # loaded iff a trainer ran (it imports torch)
    if trainer is not None:
        errors = (*errors, trainer.TrainingError)
    checkpoint = sys.modules.get("palaestra.shared.rl.checkpoint")
    if checkpoint is not None and hasattr(checkpoint, "CheckpointError"):
        errors = (*errors, checkpoint.CheckpointError)
    return errors


_USER_ERROR_NAMES = ("ConfigError", "UnknownNameError", "LLMError", "MissingExtraError", "TrainingError")
_RAISED = re.compile(r"^([A-Za-z_][\w.]*): (.+)$")


def _last_error_line(text: str) -> tuple[str, str] | None:
    """``(class name, message)`` of the last ``module.Class: message`` line of a traceback's text."""
    for line in reversed(re.sub(r"\x1b\[[0-9;]*m", "", text).strip().splitlines()):
        match = _RAISED.match(line.strip())
        if match:
            return match[1].rsplit(".", 1)[-1], match[2]
    return None


def one_line_error(err: BaseException) -> str | None:
    """The one line to print for `err` when it is the user's to fix (also raised in a Ray worker), else None."""
    if isinstance(err, _user_errors()):
        text = str(err).strip()
        if "\n" in text:  # a Ray task's error: the worker's traceback, then the message
            found = _last_error_line(text)
            text = found[1] if found else text.splitlines()[-1]
        return text
    if isinstance(err, ModuleNotFoundError):
        return missing_extra_message(err.name)
    hub = hub_error_message(err)  # no network: what it tried to reach, and HF_HUB_OFFLINE=1 / local paths
    if hub is not None:
        return hub
    if isinstance(err, pickle.UnpicklingError):  # torch.load(weights_only=True) refused a crafted file
        text = str(err).strip()
        reason = re.search(r"WeightsUnpickler error: (.*?\.)(?: |$)", text, re.MULTILINE)
        detail = reason[1] if reason else (text.splitlines()[0] if text else type(err).__name__)
        return f"refused to load a file that is not a plain checkpoint (nothing in it ran): {detail}"
    if type(err).__module__.startswith("ray."):  # e.g. an actor whose constructor raised
        found = _last_error_line(getattr(err, "error_msg", None) or str(err))
        if found is None:
            return None
        name, message = found
        if name in _USER_ERROR_NAMES or name == "FileNotFoundError":
            return f"{message} (in a Ray worker)"
        if name == "ModuleNotFoundError":
            module = re.match(r"No module named '([\w.]+)'", message)
            extra = missing_extra_message(module[1]) if module else None
            return f"{extra} (in a Ray worker)" if extra else None
    return None


def cmd_run(args: argparse.Namespace) -> int:
    from palaestra.shared.config import read_yaml, to_yaml
    from palaestra.shared.jobs import load_config, run_job, summary_table
    from palaestra.shared.pipeline import PipelineConfig, stage_configs

    if args.matrix or "matrix" in read_yaml(args.config):
        from palaestra.shared import matrix

        return matrix.run_config(args.config, args.overrides, args.matrix or (), args.metric, args.dry_run)
    cfg = load_config(args.config, args.overrides)
    if args.dry_run:
        print(to_yaml(cfg), end="")
        if isinstance(cfg, PipelineConfig):  # show (and so validate) every stage too
            for name, stage in stage_configs(cfg).items():
                print(f"# --- stage {name} ---\n{to_yaml(stage)}", end="")
        return 0
    from palaestra.shared.tracking import default_uri

    result = run_job(cfg)
    name = cfg.tracking.run_name or cfg.job
    rows = result.get("stages") or [{"stage": name, "job": cfg.job, **result}]
    uri = (cfg.tracking.uri or default_uri()) if cfg.tracking.enabled else None
    run = (
        f"run {result['run_id']} in experiment '{cfg.tracking.experiment}'" if result.get("run_id") else "no MLflow run"
    )
    print(f"\ndone: {name} ({run})\n{summary_table(rows, uri)}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from palaestra.shared.jobs import JOBS, job_summary

    names = JOBS.names()
    width = max(map(len, names), default=0)
    for name in names:
        print(f"{name:<{width}}  {job_summary(name)}")
    for name, error in JOBS.broken_plugins().items():
        print(f"(plugin failed to load: {name}: {error})", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from palaestra.shared.config_docs import describe
    from palaestra.shared.jobs import JOBS

    spec = JOBS.get(args.job)
    print(f"{spec.name}: {spec.summary}")
    print(f"config: {spec.config.__module__}.{spec.config.__qualname__}; override any field as key=value\n")
    for item in describe(spec.config):
        default = f" = {item.default}" if item.default else ""
        print(f"{item.name}: {item.type}{default}")
        if item.doc:
            print(f"    {item.doc}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.llm.serve.launch import serve
    from palaestra.shared.llm.serve.model import ServeLimits

    limits = ServeLimits(max_queue=args.max_queue, max_request_tokens=args.max_request_tokens)
    config = LLMConfig(backend=args.backend, model=args.model, device=args.device)
    serve(config, host=args.host, port=args.port, api_key=args.api_key, limits=limits)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from palaestra.shared.config import read_yaml
    from palaestra.shared.jobs import load_config
    from palaestra.shared.matrix import split_matrix
    from palaestra.shared.plan import plan_config

    data, matrix = split_matrix(read_yaml(args.config))
    if matrix is not None:  # every combination runs the same job: plan one, say how many
        count = math.prod(len(values) for values in matrix.axes.values())
        print(f"matrix of {count} combinations ({', '.join(matrix.axes)}): the plan below is of one")
    if data.get("job") == "pipeline":
        data.setdefault("config_dir", str(Path(args.config).parent))  # stage paths are relative to the file
    cfg = load_config(data, args.overrides)
    try:
        report, fits = plan_config(cfg, gpu_gb=args.gpu_gb, gpus=args.gpus, cpus=args.cpus)
    except ValueError as err:
        raise ConfigError(f"{args.config}: {err}") from None
    print(report)
    return 0 if fits else 1


def cmd_rehearse(args: argparse.Namespace) -> int:
    from palaestra.shared.rehearse import main

    return main(args.config, args.workdir, args.overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="palaestra", description="Palaestra: train and evaluate LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job from a YAML config")
    run.add_argument("config", help="path to the YAML config")
    run.add_argument("overrides", nargs="*", help="key=value overrides (dotted keys)")
    run.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    run.add_argument(
        "--matrix",
        nargs="+",
        metavar="AXIS=V1,V2",
        help="run every combination (e.g. seed=0,1,2 advantages=grpo,egpo); overrides go before it",
    )
    run.add_argument("--metric", help="the summary key of the matrix's table (default: matrix.metric)")
    run.set_defaults(fn=cmd_run)
    jobs = sub.add_parser("jobs", help="list the registered jobs")
    jobs.set_defaults(fn=cmd_jobs)
    show = sub.add_parser("show", help="every config field of a job: type, default and what it does")
    show.add_argument("job", help="a registered job (`palaestra jobs` lists them)")
    show.set_defaults(fn=cmd_show)
    serve = sub.add_parser("serve", help="OpenAI-compatible server over a local model")
    serve.add_argument("model", help="tiny | smollm2-135m | a local HF directory")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--backend", default="transformers")
    serve.add_argument("--device", default="auto")
    serve.add_argument("--api-key", default=None, help="require it as a Bearer token (default: $PALAESTRA_API_KEY)")
    serve.add_argument("--max-queue", type=int, default=64, help="requests waiting or running at once (503 beyond)")
    serve.add_argument("--max-request-tokens", type=int, default=32768, help="prompts x n x max_tokens per request")
    serve.set_defaults(fn=cmd_serve)
    plan = sub.add_parser(
        "plan",
        help="per-device memory estimate of an RL config (CPU-hours of a job in plan.JOB_PLANS, a pipeline's "
        "stages); exit 0 when it fits",
    )
    plan.add_argument("config", help="path to the YAML config")
    plan.add_argument("overrides", nargs="*", help="key=value overrides (dotted keys)")
    plan.add_argument("--gpu-gb", type=float, default=80.0, help="memory of one GPU in GB (default 80)")
    plan.add_argument("--gpus", type=int, default=8, help="GPUs available (default 8)")
    plan.add_argument("--cpus", type=int, default=64, help="Ray CPUs for evaluations (default 64; or cluster.num_cpus)")
    plan.set_defaults(fn=cmd_plan)
    rehearse = sub.add_parser("rehearse", help="a paper config end to end on CPU at small sizes (what it scaled)")
    rehearse.add_argument("config", help="path to the YAML config")
    rehearse.add_argument("overrides", nargs="*", help="key=value overrides of the rehearsal's config")
    rehearse.add_argument("--workdir", help="where it writes (default outputs/rehearsals/<config name>)")
    rehearse.set_defaults(fn=cmd_rehearse)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse with options anywhere: ``key=value`` words after an option still count as overrides."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [word for word in extra if word.startswith("-") or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    from palaestra.shared import reproducibility

    reproducibility.apply_env()  # before anything imports torch: libraries read their kernel choices at load
    args = parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("palaestra: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        line = one_line_error(err)
        if line is None:
            raise
        print(f"palaestra: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
