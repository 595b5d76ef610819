"""The verbs' own HTTP server: keep-alive, bodies of either framing, clear refusals, a bounded
number of connections, and the verbs' answers byte for byte as the service builds them."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest

from extender.service import ExtenderService
from extender.serving.verbs import verb_routes
from extender.serving.verbs_server import VerbsServer
from tests.support.pods import filter_args, pod_manifest

pytestmark = pytest.mark.timeout(60)


def _echo(raw: bytes) -> bytes:
    return json.dumps({"length": len(raw)}).encode()


def _boom(raw: bytes) -> bytes:
    raise RuntimeError("a bug")


@pytest.fixture
def server() -> Iterator[VerbsServer]:
    running = VerbsServer({"/echo": _echo, "/boom": _boom}, "127.0.0.1", 0, None, max_connections=2)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def _post(conn: http.client.HTTPConnection, path: str, body: bytes, **headers: str) -> tuple[int, dict]:
    conn.request("POST", path, body=body, headers=headers)
    reply = conn.getresponse()
    return reply.status, json.loads(reply.read())


def test_requests_share_one_kept_alive_connection(server: VerbsServer) -> None:
    """Two calls on one connection: the scheduler's client keeps it open between verbs."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    assert _post(conn, "/echo", b"x" * 10) == (200, {"length": 10})
    first_socket = conn.sock
    assert _post(conn, "/echo", b"y" * 3) == (200, {"length": 3})
    assert conn.sock is first_socket
    conn.close()


def test_a_chunked_body_is_read_whole(server: VerbsServer) -> None:
    """A body sent without Content-Length (chunked) reaches the verb complete."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("POST", "/echo", body=iter([b"abc", b"defg"]), encode_chunked=True)
    reply = conn.getresponse()
    assert reply.status == 200 and json.loads(reply.read()) == {"length": 7}
    conn.close()


def test_unknown_paths_and_methods_are_refused_plainly(server: VerbsServer) -> None:
    """Only the verbs are served: other paths get 404 with the path named, GET gets 404."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    status, body = _post(conn, "/debug/topology", b"{}")
    assert status == 404 and "/debug/topology" in body["Error"]
    conn.request("GET", "/filter")
    assert conn.getresponse().status == 404
    conn.close()


def test_a_failing_verb_answers_500_and_the_server_keeps_serving(server: VerbsServer) -> None:
    """A bug in a verb is an error answer for that call, never a dead server."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    assert _post(conn, "/boom", b"{}")[0] == 500
    assert _post(conn, "/echo", b"{}") == (200, {"length": 2})
    conn.close()


def test_a_bad_content_length_is_refused(server: VerbsServer) -> None:
    """A Content-Length that is not a number gets 400 and the connection is closed."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n")
        assert raw.recv(4096).startswith(b"HTTP/1.1 400")


def _exchange(server: VerbsServer, request: bytes) -> bytes:
    """Everything the server sends back for `request` until it closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(request)
        got = b""
        while chunk := raw.recv(4096):
            got += chunk
        return got


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /echo\r\n\r\n", b"400"),  # no version
        (b"POST /echo HTTP/2.0\r\nContent-Length: 0\r\n\r\n", b"505"),
        (b"POST /echo HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"POST /echo HTTP/1.1\r\n Folded: header\r\n\r\n", b"400"),
        (b"POST /echo HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", b"431"),
        (b"POST /echo HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
    ],
    ids=["no-version", "http-2", "no-colon", "folded", "too-many-headers", "line-too-long"],
)
def test_malformed_requests_get_the_standard_refusal_and_a_closed_connection(
    server: VerbsServer, request_bytes: bytes, status: bytes
) -> None:
    """The request line and headers are read by our own small parser: what it cannot take gets
    the status the standard library would give, and the connection ends."""
    answer = _exchange(server, request_bytes)
    assert answer.split(b" ", 2)[1] == status


def test_connection_close_and_header_names_in_any_case_are_honoured(server: VerbsServer) -> None:
    """`connection: close` ends the connection after the answer; `content-LENGTH` frames the
    body; an HTTP/1.0 request without keep-alive is answered and closed."""
    answer = _exchange(server, b"POST /echo HTTP/1.1\r\ncontent-LENGTH: 4\r\nconnection: close\r\n\r\nabcd")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"length": 4}')
    answer = _exchange(server, b"POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nab")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"length": 2}')


def test_a_client_waiting_for_100_continue_gets_it_before_sending_the_body(server: VerbsServer) -> None:
    """`Expect: 100-continue`: the server says continue, then reads the body and answers."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        assert raw.recv(4096).startswith(b"HTTP/1.1 100")
        raw.sendall(b"xyz")
        assert raw.recv(4096).endswith(b'{"length": 3}')


def test_connections_beyond_the_cap_are_closed_at_once(server: VerbsServer) -> None:
    """With the cap reached (two idle connections held), a third is closed without an answer."""
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(2)]
    time.sleep(0.3)  # both accepted and holding their slots
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
        extra.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert extra.recv(4096) == b""
    for s in held:
        s.close()
    time.sleep(0.3)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    assert _post(conn, "/echo", b"") == (200, {"length": 0})
    conn.close()


def test_the_verbs_answer_what_the_service_answers(service: ExtenderService) -> None:
    """Over the server, filter's answer is the service's own, encoded as JSON."""
    running = VerbsServer(verb_routes(service), "127.0.0.1", 0, None)
    running.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=5)
        body = filter_args(pod_manifest(gpus=1), ["nv-node"])
        status, answer = _post(conn, "/filter", json.dumps(body).encode())
        assert status == 200 and answer == service.filter(body)
        status, answer = _post(conn, "/bind", b"{not json")
        assert status == 200 and answer == {"Error": "request body must be a JSON object"}
        conn.close()
    finally:
        running.stop()
