"""`python -m extender`: the scheduler extender against a real cluster."""

from __future__ import annotations

import argparse
import logging
import sys
import threading

import uvicorn

from extender.app import create_app
from extender.cluster_api import ApiError, WatchHandlers
from extender.config import ConfigError, config_from_env
from extender.kube import KubeClusterApi, load_client
from extender.reconciler import run_reconciler
from extender.service import ExtenderService


def handlers_for(service: ExtenderService) -> WatchHandlers:
    s = service.store
    return WatchHandlers(
        node=s.apply_node,
        node_deleted=s.remove_node,
        topology=s.apply_topology,
        ledger=s.apply_ledger,
        ledger_deleted=s.remove_ledger,
        pod=s.apply_pod,
        pod_deleted=s.remove_pod,
        synced=s.mark_synced,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extender", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument("--host", help="listen address (default LINKPACK_HOST or 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (default LINKPACK_PORT or 8888)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_env()
        api = KubeClusterApi(load_client(args.kubeconfig), config)
    except (ConfigError, ApiError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    service = ExtenderService(config, api)
    stopping = threading.Event()
    threading.Thread(
        target=api.run_watches, args=(handlers_for(service), stopping.is_set), name="watches", daemon=True
    ).start()
    threading.Thread(
        target=run_reconciler, args=(service, stopping.is_set), name="reconciler", daemon=True
    ).start()
    try:
        uvicorn.run(
            create_app(service),
            host=args.host or config.host,
            port=args.port or config.port,
            log_level=args.log_level,
            access_log=False,
        )
    finally:
        stopping.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
