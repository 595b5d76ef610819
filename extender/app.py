"""The HTTP face of the extender: FastAPI routes, each a line over `ExtenderService`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from extender.debug_routes import register_debug_routes
from extender.metrics import CONTENT_TYPE
from extender.service import ExtenderService


async def _body(request: Request) -> object:
    """The JSON body, or None when it is not JSON (the verbs then answer with a clear Error)."""
    try:
        return await request.json()
    except ValueError:
        return None


def create_app(service: ExtenderService) -> FastAPI:
    app = FastAPI(title="Linkpack scheduler extender", docs_url=None, redoc_url=None)
    app.state.service = service

    @app.post("/filter")
    async def filter_verb(request: Request) -> dict[str, Any]:
        return service.filter(await _body(request))

    @app.post("/prioritize")
    async def prioritize_verb(request: Request) -> list[dict[str, Any]]:
        return service.prioritize(await _body(request))

    @app.post("/bind")
    async def bind_verb(request: Request) -> dict[str, str]:
        return await run_in_threadpool(service.bind, await _body(request))

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        ready = service.ready()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    register_debug_routes(app, service)
    return app
