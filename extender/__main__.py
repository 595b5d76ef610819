"""`python -m extender`: the scheduler extender against a real cluster.

Three servers in one process (see `extender.serving.app`): the verbs over mutual TLS, the debug
endpoints over TLS for callers with an RBAC permission, health and metrics in plain HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from extender.binding.reconciler import run_reconciler
from extender.config import TLS_VARIABLES, ConfigError, ExtenderConfig, TlsFiles, config_from_env
from extender.debug.access import DebugAccess
from extender.kube.client import KubeClusterApi, load_client
from extender.service import ExtenderService, handlers_for
from extender.serving.verbs import verb_routes
from extender.serving.verbs_server import VerbsServer, server_tls
from extender.state.cluster_api import AccessReviewer, ApiError

if TYPE_CHECKING:
    import uvicorn


def check_tls(tls: TlsFiles | None) -> TlsFiles:
    """The TLS files, each readable and loadable, or a ConfigError saying which is wrong."""
    if tls is None:
        raise ConfigError(
            f"set {', '.join(TLS_VARIABLES)}: the verbs are served only over mutual TLS (the scheduler "
            "presents a client certificate signed by the client CA) and the debug endpoints over TLS"
        )
    for name, path in (
        ("certificate", tls.cert_file),
        ("key", tls.key_file),
        ("client CA", tls.client_ca_file),
    ):
        if not Path(path).is_file():
            raise ConfigError(f"TLS {name} file {path!r} does not exist")
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tls.client_ca_file)
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"the TLS files cannot be used: {exc}") from exc
    return tls


def servers(
    service: ExtenderService, reviewer: AccessReviewer, config: ExtenderConfig, tls: TlsFiles, log_level: str
) -> list[VerbsServer | uvicorn.Server]:
    """The verbs (mutual TLS, `extender.serving.verbs_server`), debug (TLS) and ops (plain) servers.

    FastAPI and uvicorn (the debug and ops apps) are imported here, after the watches started:
    their import overlaps the first lists instead of coming before them."""
    import uvicorn

    from extender.serving.app import create_debug_app, create_ops_app

    verbs = VerbsServer(
        verb_routes(service),
        config.host,
        config.port,
        server_tls(tls.cert_file, tls.key_file, tls.client_ca_file),
    )
    common = {"host": config.host, "log_level": log_level, "access_log": False, "lifespan": "off"}
    debug = uvicorn.Config(
        create_debug_app(service, DebugAccess(reviewer, config.debug_access_ttl_s)),
        port=config.debug_port,
        ssl_certfile=tls.cert_file,
        ssl_keyfile=tls.key_file,
        **common,  # type: ignore[arg-type]
    )
    ops = uvicorn.Config(create_ops_app(service), port=config.ops_port, **common)  # type: ignore[arg-type]
    return [verbs, *(uvicorn.Server(c) for c in (debug, ops))]


async def serve_all(running: list[VerbsServer | uvicorn.Server]) -> None:
    """Serve until any server stops (a signal stops them all)."""
    tasks = [asyncio.create_task(s.serve()) for s in running]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for s in running:
        s.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extender", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument("--host", help="listen address (default LINKPACK_HOST or 0.0.0.0)")
    parser.add_argument("--port", type=int, help="verbs port, mutual TLS (default LINKPACK_PORT or 8888)")
    parser.add_argument(
        "--debug-port", type=int, help="debug port, TLS (default LINKPACK_DEBUG_PORT or 8889)"
    )
    parser.add_argument(
        "--ops-port", type=int, help="health and metrics port (default LINKPACK_OPS_PORT or 8890)"
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_env()
        config = _with_flags(config, args)
        tls = check_tls(config.tls)
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
        target=run_reconciler, args=(service, stopping.is_set, 1.0), name="reconciler", daemon=True
    ).start()
    try:
        asyncio.run(serve_all(servers(service, api, config, tls, args.log_level)))
    finally:
        stopping.set()
    return 0


def _with_flags(config: ExtenderConfig, args: argparse.Namespace) -> ExtenderConfig:
    from dataclasses import replace

    return replace(
        config,
        host=args.host or config.host,
        port=args.port or config.port,
        debug_port=args.debug_port or config.debug_port,
        ops_port=args.ops_port or config.ops_port,
    )


if __name__ == "__main__":
    raise SystemExit(main())
