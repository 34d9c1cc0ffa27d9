"""``GET /health`` (no key needed) and ``GET /v1/models`` (the one model served)."""

from palaestra.shared.llm.serve.server import Server


def add_routes(app, server: Server) -> None:
    from fastapi import Depends

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(server.authorize)])
    def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": server.model_name, "object": "model", "created": server.started, "owned_by": "palaestra"}],
        }
