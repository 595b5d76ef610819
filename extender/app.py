"""The HTTP face of the extender: FastAPI routes, each a line over `ExtenderService`.

The verbs' work (JSON decoding, placement, scoring, API writes) runs on the thread pool; the
event loop only moves bytes, so `/healthz`, `/metrics` and other calls never wait behind a
slow filter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from extender.debug_routes import register_debug_routes
from extender.metrics import CONTENT_TYPE
from extender.service import ExtenderService

T = TypeVar("T")


def _decode(raw: bytes) -> object:
    """The JSON body, or None when it is not JSON (the verbs then answer with a clear Error)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _verb(fn: Callable[[object], T]) -> Callable[[bytes], T]:
    def run(raw: bytes) -> T:
        return fn(_decode(raw))

    return run


def create_app(service: ExtenderService) -> FastAPI:
    app = FastAPI(title="Linkpack scheduler extender", docs_url=None, redoc_url=None)
    app.state.service = service

    filter_body, prioritize_body, bind_body = (
        _verb(service.filter),
        _verb(service.prioritize),
        _verb(service.bind),
    )

    @app.post("/filter")
    async def filter_verb(request: Request) -> dict[str, Any]:
        return await run_in_threadpool(filter_body, await request.body())

    @app.post("/prioritize")
    async def prioritize_verb(request: Request) -> list[dict[str, Any]]:
        return await run_in_threadpool(prioritize_body, await request.body())

    @app.post("/bind")
    async def bind_verb(request: Request) -> dict[str, str]:
        return await run_in_threadpool(bind_body, await request.body())

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
