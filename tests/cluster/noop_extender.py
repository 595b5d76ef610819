"""A no-op scheduler extender on the standard library, for exercising the real kube-scheduler.

`filter` keeps every node, `prioritize` scores every node 0, `bind` creates the pod's Binding
through the API (as the real extender must, protocols.md §6.1). Each call is recorded. The
server answers keep-alive HTTP/1.1 with TCP_NODELAY (without it, every call costs ~40 ms of
Nagle + delayed ACK).
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.controlplane import bind_pod


@dataclass
class ExtenderCall:
    verb: str
    body: dict[str, Any]
    response: Any = None


@dataclass
class _Shared:
    api: client.ApiClient
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[ExtenderCall] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_GET(self) -> None:
        self._reply(200, {"ok": True} if self.path in ("/healthz", "/readyz") else None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._reply(400, {"Error": "bad JSON"})
            return
        verb = self.path.strip("/").rsplit("/", 1)[-1]
        if verb == "filter":
            names = body.get("NodeNames") or []
            response: Any = {
                "NodeNames": names,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": "",
            }
        elif verb == "prioritize":
            response = [{"Host": name, "Score": 0} for name in body.get("NodeNames") or []]
        elif verb == "bind":
            response = {"Error": self._bind(body)}
        else:
            self._reply(404, {"Error": f"unknown verb {verb!r}"})
            return
        with self.server.shared.lock:
            self.server.shared.calls.append(ExtenderCall(verb, body, response))
        self._reply(200, response)

    def _bind(self, args: dict[str, Any]) -> str:
        try:
            status = bind_pod(
                self.server.shared.api,
                str(args.get("PodNamespace")),
                str(args.get("PodName")),
                str(args.get("Node")),
                uid=str(args.get("PodUID") or "") or None,
            )
        except ApiException as exc:
            return f"binding failed: HTTP {exc.status}: {exc.reason}"
        return "" if 200 <= status < 300 else f"binding failed: HTTP {status}"

    def _reply(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    shared: _Shared


class NoopExtender:
    """Start with `with NoopExtender(api_client) as ext:`; point the scheduler at `ext.url`."""

    def __init__(self, api: client.ApiClient, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.shared = _Shared(api)
        self._thread = threading.Thread(target=self._server.serve_forever, name="noop-extender", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def calls(self) -> list[ExtenderCall]:
        with self._server.shared.lock:
            return list(self._server.shared.calls)

    def verbs(self) -> list[str]:
        return [call.verb for call in self.calls]

    def start(self) -> NoopExtender:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> NoopExtender:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
