"""`python -m bench.floor_extender`: the cheapest extender that speaks the protocol, for the throughput floor.

Standard library only on the request path: `http.server` with one thread per connection,
HTTP/1.1 keep-alive and TCP_NODELAY; filter keeps every node, prioritize scores every node 0,
bind posts the pod's Binding with `http.client` over one kept-alive connection per thread.
With `--tls-cert/--tls-key/--client-ca` it serves mutual TLS exactly as the Linkpack extender
does (a client certificate signed by the client CA is required), so the two compare like with like.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import yaml


class ApiTarget:
    """The API server of a kubeconfig (bearer token users only, as the test control plane writes)."""

    def __init__(self, kubeconfig: str) -> None:
        with open(kubeconfig, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        context = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == context["user"])
        url = urlsplit(cluster["server"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.tls = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
        if cluster.get("insecure-skip-tls-verify"):
            self.tls.check_hostname = False
            self.tls.verify_mode = ssl.CERT_NONE
        self.headers = {"Authorization": f"Bearer {user['token']}", "Content-Type": "application/json"}
        self._local = threading.local()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        for attempt in (1, 2):  # a kept-alive connection the server closed is reopened once
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPSConnection(self.host, self.port, context=self.tls)
            try:
                conn.request("POST", path, body=data, headers=self.headers)
                reply = conn.getresponse()
                return reply.status, reply.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._reply(200 if self.path in ("/healthz", "/readyz") else 404, {"ready": True})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/filter":
            answer: Any = {
                "NodeNames": body.get("NodeNames") or [],
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": "",
            }
        elif self.path == "/prioritize":
            answer = [{"Host": n, "Score": 0} for n in body.get("NodeNames") or []]
        elif self.path == "/bind":
            answer = {"Error": self._bind(body)}
        else:
            self._reply(404, {"Error": "no such verb"})
            return
        self._reply(200, answer)

    def _bind(self, b: dict[str, Any]) -> str:
        namespace, name = b["PodNamespace"], b["PodName"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": b.get("PodUID") or None},
            "target": {"apiVersion": "v1", "kind": "Node", "name": b["Node"]},
        }
        try:
            status, reply = self.server.api.post(
                f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding
            )
        except (OSError, http.client.HTTPException) as exc:
            return f"binding failed: {exc}"
        return "" if 200 <= status < 300 else f"binding failed: HTTP {status} {reply[:200]!r}"

    def _reply(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: ApiTarget
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:  # the handshake runs on the connection's own thread
            request.settimeout(10)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                request.close()
                return
            request.settimeout(None)
            try:
                super().finish_request(request, client_address)
            finally:
                request.close()
            return
        super().finish_request(request, client_address)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_extender", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--client-ca")
    args = parser.parse_args()
    server = _Server(("127.0.0.1", args.port), _Handler)
    server.api = ApiTarget(args.kubeconfig)
    if args.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=args.client_ca)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        context.verify_mode = ssl.CERT_REQUIRED
        server.tls = context
    server.serve_forever()


if __name__ == "__main__":
    main()
