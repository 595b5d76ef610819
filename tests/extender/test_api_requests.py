"""The request path's own connection pool against a local HTTP server: paths under the API
server's base URL, credential headers reused for a while and renewed at once after a 401."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from extender.kube.api_requests import AUTH_REFRESH_S, ApiRequests

pytestmark = pytest.mark.timeout(60)


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str, bytes]]
    refuse: set[str]  # tokens answered 401

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        token = self.headers.get("Authorization") or ""
        self.seen.append((self.command, self.path, token, body))
        status, reply = (401, b'{"message":"Unauthorized"}') if token in self.refuse else (200, b"{}")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_PUT = do_POST = _answer


@pytest.fixture
def api_server() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"seen": [], "refuse": set()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


class _Tokens:
    """A configuration's refresh hook handing out token-1, token-2, ... one per refresh."""

    def __init__(self) -> None:
        self.refreshes = 0

    def __call__(self, cfg: client.Configuration) -> None:
        self.refreshes += 1
        cfg.api_key = {"authorization": f"token-{self.refreshes}"}
        cfg.api_key_prefix = {"authorization": "Bearer"}


def _requests(host: str, tokens: _Tokens, now: list[float]) -> ApiRequests:
    cfg = client.Configuration(host=host, api_key={"authorization": "token-0"})
    cfg.refresh_api_key_hook = tokens
    return ApiRequests(client.ApiClient(cfg), clock=lambda: now[0])


def test_calls_go_under_the_base_path_with_the_credentials_of_one_refresh(
    api_server: tuple[str, type[_Recorder]],
) -> None:
    """Three calls within the refresh period: one refresh, the same token on each, the JSON body
    sent as is, every path under the base URL's own path."""
    url, handler = api_server
    tokens, now = _Tokens(), [100.0]
    requests = _requests(url + "/through/a/proxy/", tokens, now)
    assert requests.call("GET", "/api/v1/namespaces/ml/pods/a").ok
    now[0] += AUTH_REFRESH_S / 2
    requests.call("PUT", "/api/v1/namespaces/ml/configmaps/b", {"data": {"k": "v"}})
    requests.call("POST", "/api/v1/namespaces/ml/pods/a/binding", {"kind": "Binding"})
    assert tokens.refreshes == 1
    assert [(m, p, t) for m, p, t, _ in handler.seen] == [
        ("GET", "/through/a/proxy/api/v1/namespaces/ml/pods/a", "Bearer token-1"),
        ("PUT", "/through/a/proxy/api/v1/namespaces/ml/configmaps/b", "Bearer token-1"),
        ("POST", "/through/a/proxy/api/v1/namespaces/ml/pods/a/binding", "Bearer token-1"),
    ]
    assert handler.seen[1][3] == b'{"data":{"k":"v"}}'


def test_credentials_are_read_again_after_the_refresh_period_and_at_once_after_a_401(
    api_server: tuple[str, type[_Recorder]],
) -> None:
    """Past the refresh period the next call reads the credentials again; a call refused with
    401 reads them at once and is sent again with the new token, whose answer is the call's."""
    url, handler = api_server
    tokens, now = _Tokens(), [0.0]
    requests = _requests(url, tokens, now)
    requests.call("GET", "/api")
    now[0] += AUTH_REFRESH_S
    requests.call("GET", "/api")
    handler.refuse.add("Bearer token-2")  # rotated away on the server
    reply = requests.call("GET", "/api")
    assert reply.ok and tokens.refreshes == 3
    assert [t for _, _, t, _ in handler.seen] == [
        "Bearer token-1",
        "Bearer token-2",
        "Bearer token-2",
        "Bearer token-3",
    ]
    handler.refuse.add("Bearer token-3")
    handler.refuse.add("Bearer token-4")
    assert requests.call("GET", "/api").status == 401  # refused twice: the 401 is the answer
