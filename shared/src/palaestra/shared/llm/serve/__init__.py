"""``palaestra serve``: an OpenAI-compatible HTTP server over any `LLMClient`.

- `app`: `create_app` (the FastAPI app: error handlers, then each endpoint's module adds its route);
- `model`: `ServeLimits`, `RequestError`, the served model's validation (`ServedModel`);
- `server`: `Server`, what every endpoint shares (authorization, admission, waiting for a job, streaming);
- `chat`, `completions`, `info`: one module per endpoint (``POST /v1/chat/completions``, ``POST /v1/completions``,
  ``GET /v1/models`` and ``GET /health``);
- `protocol`: the wire format; `batcher`: generation in micro-batches; `stream`: text pieces as tokens arrive;
- `launch`: ``palaestra serve`` itself (a process, a thread, a subprocess for tests).
"""
