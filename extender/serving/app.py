"""The HTTP faces of the extender: routes that are each a line over `ExtenderService`.

`python -m extender` serves three faces on three ports, each guarded for its own callers:
- `extender.serving.verbs.verb_routes`: filter, prioritize, bind, served by `extender.serving.verbs_server` over
  mutual TLS (only a client certificate signed by the scheduler's CA gets a connection: the TLS
  layer refuses everyone else);
- `create_debug_app`: /debug/*, over TLS, each request carrying a Kubernetes identity with an
  explicit RBAC permission (`extender.debug.access`);
- `create_ops_app`: /healthz, /readyz, /metrics in plain HTTP, for the kubelet's probes and
  Prometheus (read-only, and admitted by the NetworkPolicy only from those).
`create_app` puts everything on one unauthenticated app for the demo and in-process tests.

The verbs' work (JSON decoding, placement, scoring, API writes) runs on the verbs server's
connection threads (or, in the FastAPI apps, on the thread pool): never on an event loop, so
`/healthz`, `/metrics` and other calls never wait behind a slow filter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from extender.debug.access import DebugAccess, Denied
from extender.debug.routes import register_debug_routes
from extender.metrics import CONTENT_TYPE
from extender.service import ExtenderService
from extender.wire import decode_json

T = TypeVar("T")


def _verb(fn: Callable[[object], T]) -> Callable[[bytes], T]:
    def run(raw: bytes) -> T:
        return fn(decode_json(raw))

    return run


def _new_app(title: str) -> FastAPI:
    return FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)


def register_verbs(app: FastAPI, service: ExtenderService) -> None:
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


def register_ops(app: FastAPI, service: ExtenderService) -> None:
    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        waiting = service.waiting_for()
        return JSONResponse(
            {"ready": not waiting, "waiting_for": list(waiting)}, status_code=503 if waiting else 200
        )

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)


def create_ops_app(service: ExtenderService) -> FastAPI:
    app = _new_app("Linkpack scheduler extender: health and metrics")
    register_ops(app, service)
    return app


def create_debug_app(service: ExtenderService, access: DebugAccess) -> FastAPI:
    app = _new_app("Linkpack scheduler extender: debug")

    @app.middleware("http")
    async def authorize(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        decided = await run_in_threadpool(access.check, headers, request.method, request.url.path)
        if isinstance(decided, Denied):
            answer = JSONResponse({"error": decided.message}, status_code=decided.status)
            if decided.status == 401:
                answer.headers["WWW-Authenticate"] = 'Bearer realm="linkpack-extender"'
            return answer
        return await call_next(request)

    register_debug_routes(app, service)
    return app


def create_app(service: ExtenderService) -> FastAPI:
    """Every route on one app with no authentication: for the demo on loopback and for tests."""
    app = _new_app("Linkpack scheduler extender")
    app.state.service = service
    register_verbs(app, service)
    register_ops(app, service)
    register_debug_routes(app, service)
    return app
