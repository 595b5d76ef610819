"""`python bench/extender_server.py --fleet FILE --port P`: the extender over an in-memory fleet.

FILE holds the fleet as the API server would list it (Node, GpuTopology and ledger ConfigMap
objects as JSON; `bench.extender` writes it). The process decodes every object the way the
watches do, hands it to the extender's store, serves the verbs on loopback HTTP and prints
`ready` once the extender reports ready, so the parent can time start to ready.

It is run as a script (not `-m`, and with `python -P`), so that PYTHONPATH alone decides which checkout's extender
it serves: the benchmark runs the code of an earlier revision side by side with this one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from typing import Any


def _load(path: str) -> Any:
    from contract.ledger import ledger_from_config_map
    from extender.config import ExtenderConfig
    from extender.kube.in_memory import InMemoryCluster
    from extender.kube.translate import node_facts, read_gpu_topology

    try:  # as the watches' relist does (an earlier revision: the collector stays on)
        from extender.kube.gc_pause import collector_paused
    except ImportError:
        collector_paused = contextlib.nullcontext

    with collector_paused():
        with open(path, encoding="utf-8") as f:
            fleet = json.load(f)
        config = ExtenderConfig()
        cluster = InMemoryCluster(config)
        for node, topology in zip(fleet["nodes"], fleet["topologies"], strict=True):
            _, published, problem = read_gpu_topology(topology)
            if problem:
                raise SystemExit(problem)
            cluster.add_node(node_facts(node, config.resources), published)
        for config_map in fleet["ledgers"]:
            cluster.write_ledger(ledger_from_config_map(config_map))
        del fleet
    return config, cluster


def _serve(service: Any, port: int) -> None:
    try:
        from extender.serving.verbs import verb_routes
    except ImportError:
        try:  # an earlier revision: the routes next to the FastAPI apps
            from extender.serving.app import verb_routes
        except ImportError:  # earlier still: the verbs on FastAPI + uvicorn
            _serve_fastapi(service, port)
            return
    from extender.serving.verbs_server import VerbsServer

    VerbsServer(verb_routes(service), "127.0.0.1", port, None).start()


def _serve_fastapi(service: Any, port: int) -> None:
    import uvicorn

    from extender.serving.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(service), host="127.0.0.1", port=port, log_level="warning", access_log=False
        )
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        from extender.service import ExtenderService, handlers_for
    except ImportError:  # an earlier revision: next to the real process's HTTP servers
        from extender.__main__ import handlers_for
        from extender.service import ExtenderService

    config, cluster = _load(args.fleet)
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    _serve(service, args.port)
    while not service.ready():
        time.sleep(0.01)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
