"""The ``palaestra`` command: ``run``, ``jobs``, ``serve``.

Heavy imports happen inside each command, so ``--help`` and ``jobs`` are quick.
User mistakes (a bad config, an unknown job or backend, a missing model, a
server that does not answer) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys

from palaestra.shared.config import ConfigError
from palaestra.shared.registry import UnknownNameError


def _user_errors() -> tuple[type[BaseException], ...]:
    from palaestra.shared.llm.base import LLMError

    return (ConfigError, UnknownNameError, LLMError, FileNotFoundError)


def cmd_run(args: argparse.Namespace) -> int:
    from palaestra.shared.config import to_yaml
    from palaestra.shared.jobs import PipelineConfig, load_config, run_job, stage_configs

    cfg = load_config(args.config, args.overrides)
    if args.dry_run:
        print(to_yaml(cfg), end="")
        if isinstance(cfg, PipelineConfig):  # show (and so validate) every stage too
            for name, stage in stage_configs(cfg).items():
                print(f"# --- stage {name} ---\n{to_yaml(stage)}", end="")
        return 0
    result = run_job(cfg)
    scalars = {k: v for k, v in result.items() if isinstance(v, int | float | str) and k != "run_id"}
    shown = dict(list(scalars.items())[:12])
    more = f" (+{len(scalars) - len(shown)} more in MLflow)" if len(scalars) > len(shown) else ""
    print(f"done: run {result.get('run_id')}: {shown}{more}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from palaestra.shared.jobs import JOBS

    names = [n for n in JOBS.names() if not n.startswith("<broken")]
    width = max(map(len, names), default=0)
    for name in names:
        print(f"{name:<{width}}  {JOBS.get(name).summary}")
    for name in JOBS.names():
        if name.startswith("<broken"):
            print(f"(plugin failed to load: {name[8:-1]}: {JOBS._entries[name]})", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.llm.serve import serve

    serve(LLMConfig(backend=args.backend, model=args.model, device=args.device), host=args.host, port=args.port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="palaestra", description="Palaestra: train and evaluate LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job from a YAML config")
    run.add_argument("config", help="path to the YAML config")
    run.add_argument("overrides", nargs="*", help="key=value overrides (dotted keys)")
    run.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    run.set_defaults(fn=cmd_run)
    jobs = sub.add_parser("jobs", help="list the registered jobs")
    jobs.set_defaults(fn=cmd_jobs)
    serve = sub.add_parser("serve", help="OpenAI-compatible server over a local model")
    serve.add_argument("model", help="tiny | smollm2-135m | a local HF directory")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--backend", default="transformers")
    serve.add_argument("--device", default="auto")
    serve.set_defaults(fn=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except _user_errors() as err:
        print(f"palaestra: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("palaestra: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
