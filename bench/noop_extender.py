"""`python -m bench.noop_extender`: the extender protocol with no decisions, for the throughput floor.

Served the same way as the real extender (FastAPI + uvicorn): filter keeps every node,
prioritize scores 0, bind creates the Binding and nothing else.
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from extender.config import ExtenderConfig
from extender.kube import KubeClusterApi, load_client


def create_app(api: KubeClusterApi) -> FastAPI:
    app = FastAPI()

    @app.post("/filter")
    async def filter_verb(request: Request) -> dict[str, Any]:
        body = await request.json()
        return {
            "Nodes": None,
            "NodeNames": body.get("NodeNames") or [],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }

    @app.post("/prioritize")
    async def prioritize_verb(request: Request) -> list[dict[str, Any]]:
        body = await request.json()
        return [{"Host": n, "Score": 0} for n in body.get("NodeNames") or []]

    @app.post("/bind")
    async def bind_verb(request: Request) -> dict[str, str]:
        b = await request.json()
        try:
            await run_in_threadpool(
                api.bind, b["PodNamespace"], b["PodName"], b.get("PodUID", ""), "", b["Node"], {}
            )
        except Exception as exc:  # the protocol wants the reason as text
            return {"Error": str(exc)}
        return {"Error": ""}

    @app.get("/readyz")
    def readyz() -> dict[str, bool]:
        return {"ready": True}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    api = KubeClusterApi(load_client(args.kubeconfig), ExtenderConfig())
    uvicorn.run(create_app(api), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
