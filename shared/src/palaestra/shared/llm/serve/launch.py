"""Running ``palaestra serve``: the command (`serve`), in a thread of this process, or in a child process.

`serve_in_thread` and `ServeProcess` (for tests and local teachers) bind a free
loopback port and hand back the base URL (``http://127.0.0.1:PORT/v1``). Every
way stops on SIGTERM or SIGINT (or on leaving the context) by cancelling every
generation first, so it exits within seconds.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager

from palaestra.shared.llm.base import LLMClient, LLMConfig, LLMError, make_client
from palaestra.shared.llm.serve.app import create_app
from palaestra.shared.llm.serve.model import ServeLimits, server_stack

API_KEY_ENV = "PALAESTRA_API_KEY"
"""The environment variable ``palaestra serve`` reads its API key from when ``--api-key`` is not given."""


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when `host` is reachable beyond this machine and no API key guards it."""
    if api_key:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (
        f"palaestra serve: warning: listening on {host} without an API key: anyone who can reach this port can "
        f"use the model (set --api-key or {API_KEY_ENV})"
    )


def uvicorn_server(app, host: str, port: int):
    """A uvicorn server for `app` whose exit signal first cancels every generation (SIGTERM ends it in seconds)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.batcher.close()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
    return Server(config)


def serve(
    config: LLMConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: ServeLimits | None = None,
) -> None:
    """Load `config`'s model and serve it until SIGTERM or SIGINT."""
    server_stack()
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    if warning := exposure_warning(host, api_key):
        print(warning, file=sys.stderr, flush=True)
    client = make_client(config)
    app = create_app(client, config.model, limits, api_key)
    print(f"palaestra serve: {config.model} ({config.backend}) on http://{host}:{port}/v1", flush=True)
    uvicorn_server(app, host, port).run()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve_in_thread(
    client: LLMClient, model_name: str = "tiny", limits: ServeLimits | None = None, api_key: str | None = None
):
    """Serve `client` on a free loopback port from a thread of this process; yields the base URL (``.../v1``).

    For tests and in-process teachers; the server stops (its generations cancelled) on exit.
    """
    app = create_app(client, model_name, limits, api_key)
    port = free_port()
    server = uvicorn_server(app, "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True, name="palaestra-serve")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise LLMError(f"palaestra serve did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        app.state.batcher.close()
        server.should_exit = True
        thread.join(timeout=10)


class ServeProcess:
    """``palaestra serve MODEL [ARGS]`` in a child process on a free loopback port (a context manager).

    ``url`` is its base URL (``.../v1``) once it answers ``/health``; ``proc`` the process. On exit it is sent
    SIGTERM (then killed after 10 s).
    """

    def __init__(self, model: str = "tiny", args: tuple[str, ...] = (), threads: int = 1, timeout_s: float = 120.0):
        self.model, self.args, self.threads, self.timeout_s = model, list(args), threads, timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ServeProcess:
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", "palaestra.shared.cli", "serve", self.model, "--port", str(self.port)]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd + self.args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.proc.poll() is not None:
                tail = self.output().strip().splitlines()[-1:]
                raise LLMError(f"palaestra serve {self.model} exited with {self.proc.returncode}: {' '.join(tail)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise LLMError(
                        f"palaestra serve {self.model} did not answer within {self.timeout_s:.0f} s"
                    ) from None
                time.sleep(0.2)

    def output(self) -> str:
        """What the server printed so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@contextmanager
def serve_in_subprocess(model: str = "tiny", device: str = "cpu", threads: int = 1, timeout_s: float = 120.0):
    """Run ``palaestra serve MODEL`` on a free loopback port in a child process; yields its base URL (``.../v1``)."""
    with ServeProcess(model, ("--device", device), threads, timeout_s) as server:
        yield server.url
