"""The verbs' HTTP server: filter, prioritize and bind over mutual TLS, on the standard library.

kube-scheduler keeps a few connections to the extender alive and sends one request at a time
on each, so the server gives every connection its own thread: the verb's work (JSON, decisions,
API writes) runs there and blocks nothing else, and `/healthz` or `/metrics` (served by the ops
app) never wait behind it. HTTP/1.1 keep-alive, TCP_NODELAY and each answer sent in one write
keep a call at one round trip. The TLS handshake runs on the connection's thread with a
deadline, so a slow or hostile client ties up only its own thread, and the number of
connections open at once is capped. Without a client certificate signed by the client CA the
handshake fails and no request is read.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

#: A verb: the raw request body in, the JSON answer (bytes) out. It never raises on bad input.
Route = Callable[[bytes], bytes]

MAX_BODY_BYTES = 256 * 1024 * 1024  # full Node objects of a large cluster (nodeCacheCapable: false)
_MAX_HEADERS = 100  # header lines per request, as the standard library allows
_MAX_LINE = 65536  # bytes per request or header line, as the standard library allows
_JSON = "application/json"


class _BodyError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _VerbHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "linkpack-extender"
    sys_version = ""
    server: _ThreadedServer
    fields: dict[str, str]
    raw_requestline: bytes

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout_s)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # no access log, as before
        return

    def parse_request(self) -> bool:
        """The request line and headers (`self.fields`, lower-case names), read without the
        e-mail parser the standard library uses for them: at thousands of calls a second that
        parser cost more than the rest of the request's plumbing. Malformed requests get the
        statuses the standard library gives (400, 431, 505), with a JSON error like every other
        answer here, and the connection is closed."""
        self.command = None  # type: ignore[assignment]
        self.request_version = version = self.default_request_version
        self.close_connection = True
        self.requestline = line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if len(words) != 3:
            return self._refuse(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({line!r})")
        command, target, version = words
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            return self._refuse(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({version})")
        self.command, self.path, self.request_version = command, target, version
        fields: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            raw = self.rfile.readline(_MAX_LINE + 1)
            if len(raw) > _MAX_LINE:
                return self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
            if raw in (b"\r\n", b"\n", b""):
                break
            name, colon, value = raw.decode("iso-8859-1").partition(":")
            if not colon or not name or name != name.strip():
                return self._refuse(HTTPStatus.BAD_REQUEST, f"Malformed header line ({raw[:80]!r})")
            fields[name.lower()] = value.strip()
        else:
            return self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
        self.fields = fields
        connection = fields.get("connection", "").lower()
        self.close_connection = connection == "close" or (
            version == "HTTP/1.0" and connection != "keep-alive"
        )
        if fields.get("expect", "").lower() == "100-continue" and version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def _refuse(self, status: HTTPStatus, message: str) -> bool:
        self.close_connection = True
        self._send(status, _error_json(message))
        return False

    def do_POST(self) -> None:
        try:
            body = self._body()
        except _BodyError as exc:
            self.close_connection = True
            self._send(exc.status, _error_json(str(exc)))
            return
        route = self.server.routes.get(self.path)
        if route is None:
            self._send(HTTPStatus.NOT_FOUND, _error_json(f"no verb at {self.path}"))
            return
        try:
            answer = route(body)
        except Exception:  # a bug in a verb: answer it, keep serving
            log.exception("verb %s failed", self.path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, _error_json("internal error in the extender"))
            return
        self._send(HTTPStatus.OK, answer)

    def do_GET(self) -> None:
        self._send(HTTPStatus.NOT_FOUND, _error_json(f"no verb at {self.path}"))

    def _body(self) -> bytes:
        if "chunked" in self.fields.get("transfer-encoding", "").lower():
            return self._chunked()
        raw_length = self.fields.get("content-length")
        try:
            length = int(raw_length) if raw_length is not None else 0
        except ValueError as exc:
            raise _BodyError(HTTPStatus.BAD_REQUEST, "Content-Length is not a number") from exc
        if length < 0 or length > MAX_BODY_BYTES:
            raise _BodyError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
        return self.rfile.read(length)

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise _BodyError(HTTPStatus.BAD_REQUEST, "malformed chunked body") from exc
            total += size
            if total > MAX_BODY_BYTES:
                raise _BodyError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def _send(self, status: HTTPStatus, data: bytes) -> None:
        head = (
            f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {_JSON}\r\n"
            f"Content-Length: {len(data)}\r\n"
            + ("Connection: close\r\n" if self.close_connection else "")
            + "\r\n"
        )
        self.wfile.write(head.encode("latin-1") + data)


def _error_json(message: str) -> bytes:
    import json

    return json.dumps({"Error": message}).encode()


class _ThreadedServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # idle keep-alive connections never hold up a shutdown

    def __init__(
        self,
        address: tuple[str, int],
        routes: Mapping[str, Route],
        tls: ssl.SSLContext | None,
        max_connections: int,
        idle_timeout_s: float,
        handshake_timeout_s: float,
    ) -> None:
        self.routes = dict(routes)
        self.tls = tls
        self.idle_timeout_s = idle_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _VerbHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("refusing a connection from %s: too many open", client_address[0])
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(self.handshake_timeout_s)
        try:
            secured = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as exc:  # no or a foreign client certificate, or too slow
            log.info("TLS handshake with %s failed: %s", client_address[0], exc)
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address[0], exc_info=True)


def server_tls(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext:
    """Mutual TLS: our certificate, and only clients with a certificate signed by the client CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca_file)
    context.load_cert_chain(cert_file, key_file)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


class VerbsServer:
    """Serves `routes` on (host, port). `serve()` runs it from asyncio next to uvicorn servers
    (same `started` / `should_exit` handshake); `start()` / `stop()` run it from plain code."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        *,
        max_connections: int = 128,
        idle_timeout_s: float = 120.0,
        handshake_timeout_s: float = 10.0,
    ) -> None:
        self._server = _ThreadedServer(
            (host, port), routes, tls, max_connections, idle_timeout_s, handshake_timeout_s
        )
        self._thread: threading.Thread | None = None
        self.started = False
        self.should_exit = False

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def install_signal_handlers(self) -> None:
        """Signals are left to the uvicorn servers beside this one (see `extender.__main__`)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,), name="verbs")
        self._thread.daemon = True
        self._thread.start()
        self.started = True

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self.started = False

    async def serve(self) -> None:
        self.start()
        try:
            while not self.should_exit:
                await asyncio.sleep(0.5)
        finally:
            await asyncio.to_thread(self.stop)
