"""`KubeReader` against a stand-in API server and extender on loopback, and `main` end to end."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from kubectl_linkpack.cli import main
from kubectl_linkpack.cluster_reader import ExtenderReply, KubeReader, kubeconfig_path
from kubectl_linkpack.errors import PluginError

from .fakes import NODE, default_ledgers, default_nodes, default_topologies
from .test_explain import UNSEEN, bound_doc

TOPOLOGIES = "/apis/linkpack.io/v1alpha1/gputopologies"
PROXY = "/api/v1/namespaces/linkpack-system/services/https:linkpack-extender:debug/proxy"


@dataclass
class FakeHttp:
    """Answers GETs from `routes` (unquoted path -> status and body); records each request's raw path."""

    url: str = ""
    routes: dict[str, tuple[int, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    tokens: list[tuple[str, str]] = field(default_factory=list)  # (Authorization, X-Linkpack-Authorization)


@pytest.fixture
def http() -> Iterator[FakeHttp]:
    fake = FakeHttp()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.requests.append(self.path)
            fake.tokens.append(
                (self.headers.get("Authorization", ""), self.headers.get("X-Linkpack-Authorization", ""))
            )
            status, body = fake.routes.get(
                unquote(urlsplit(self.path).path), (404, _status(404, "not found"))
            )
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts:
  - {{name: fake, context: {{cluster: fake, user: u, namespace: team-a}}}}
  - {{name: other, context: {{cluster: fake, user: u}}}}
current-context: fake
"""
    )
    return str(path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reader(tmp_path: Path, http: FakeHttp, context: str | None = None, url: str | None = None) -> KubeReader:
    return KubeReader(_kubeconfig(tmp_path, http.url), context, "linkpack-system", url)


def test_the_reader_lists_and_reads_objects_at_their_api_paths(tmp_path: Path, http: FakeHttp) -> None:
    """GpuTopologies, Nodes, ledgers (by label) and pods are read where the API keeps them; 404 is None."""
    topologies, nodes, ledgers = default_topologies(), default_nodes(), default_ledgers()
    http.routes.update({
        TOPOLOGIES: (200, {"items": list(topologies.values())}),
        f"{TOPOLOGIES}/{NODE}": (200, topologies[NODE]),
        "/api/v1/nodes": (200, {"items": list(nodes.values())}),
        f"/api/v1/nodes/{NODE}": (200, nodes[NODE]),
        "/api/v1/namespaces/linkpack-system/configmaps": (200, {"items": list(ledgers.values())}),
        f"/api/v1/namespaces/linkpack-system/configmaps/linkpack-ledger-{NODE}": (200, ledgers[NODE]),
        "/api/v1/pods": (200, {"items": [{"metadata": {"name": "a"}}]}),
        "/api/v1/namespaces/ml/pods": (200, {"items": [{"metadata": {"name": "b"}}, "junk"]}),
    })  # fmt: skip
    reader = _reader(tmp_path, http)
    assert reader.topologies() == list(topologies.values()) and reader.topology(NODE) == topologies[NODE]
    assert reader.nodes() == list(nodes.values()) and reader.node(NODE) == nodes[NODE]
    assert reader.ledgers() == list(ledgers.values()) and reader.ledger(NODE) == ledgers[NODE]
    assert reader.pods(None) == [{"metadata": {"name": "a"}}]
    assert reader.pods("ml") == [{"metadata": {"name": "b"}}]
    assert reader.topology("nope") is None and reader.node("nope") is None and reader.ledger("nope") is None
    assert any(
        unquote(r).endswith("/configmaps?labelSelector=linkpack.io/ledger=true") for r in http.requests
    )


def test_api_failures_leave_the_reader_as_plugin_errors(tmp_path: Path, http: FakeHttp) -> None:
    """A refusal names the call with the API's message; a non-JSON answer and a dead server are errors too."""
    http.routes[TOPOLOGIES] = (
        403,
        _status(403, 'gputopologies.linkpack.io is forbidden: User "u" cannot list'),
    )
    http.routes[f"{TOPOLOGIES}/{NODE}"] = (500, "oops, not JSON")
    http.routes["/api/v1/nodes"] = (200, "<html>a proxy's login page</html>")
    reader = _reader(tmp_path, http)
    with pytest.raises(
        PluginError, match=r"^listing GpuTopology objects: HTTP 403 gputopologies\.linkpack\.io is "
    ):
        reader.topologies()
    with pytest.raises(PluginError, match=f"^reading GpuTopology {NODE}: HTTP 500 "):
        reader.topology(NODE)
    with pytest.raises(PluginError, match=r"^listing Nodes: "):
        reader.nodes()
    dead = KubeReader(
        _kubeconfig(tmp_path, f"http://127.0.0.1:{_closed_port()}"), None, "linkpack-system", None
    )
    with pytest.raises(PluginError, match=r"^listing pods in ml: "):
        dead.pods("ml")


def test_explain_goes_through_the_service_proxy(tmp_path: Path, http: FakeHttp) -> None:
    """Without a URL the extender is asked through the API server's proxy; its own 404 is passed through."""
    http.routes[f"{PROXY}/debug/explain/ml/trainer"] = (200, bound_doc())
    http.routes[f"{PROXY}/debug/explain/other/ghost"] = (404, UNSEEN)
    http.routes[f"{PROXY}/debug/explain/ml/down"] = (503, "no endpoints available for service")
    reader = _reader(tmp_path, http)
    assert reader.explain("ml", "trainer") == ExtenderReply(200, bound_doc())
    assert reader.explain("other", "ghost") == ExtenderReply(404, UNSEEN)
    assert http.tokens[-1][1] == "Bearer t"  # the user's own token, past the proxy
    where = "asking the extender through the service proxy of linkpack-system/https:linkpack-extender:debug"
    with pytest.raises(PluginError, match=f"^{where}: HTTP 503"):
        reader.explain("ml", "down")
    with pytest.raises(PluginError, match=f"^{where}: HTTP 404"):
        reader.explain("ml", "no-route")  # the API server's 404 (no such Service), not the extender's


def test_main_asks_an_extender_url_over_http(
    http: FakeHttp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--extender-url is asked directly, with the pod's name quoted into the path."""
    http.routes["/debug/explain/ml/trainer"] = (200, bound_doc())
    http.routes["/debug/explain/ml/a b"] = (404, {**UNSEEN, "error": "never asked about ml/a b"})
    kubeconfig = _kubeconfig(tmp_path, f"http://127.0.0.1:{_closed_port()}")  # the API is never asked
    assert main(["--kubeconfig", kubeconfig, "explain", "ml/trainer", "--extender-url", http.url + "/"]) == 0
    assert capsys.readouterr().out.startswith("Pod ml/trainer: bound\n  bound to nv-node on GPUs [0, 1]")
    assert main(["--kubeconfig", kubeconfig, "explain", "-n", "ml", "a b", "--extender-url", http.url]) == 1
    assert capsys.readouterr().out == "error: never asked about ml/a b\n"
    assert http.requests[-1] == "/debug/explain/ml/a%20b"
    assert http.tokens[-1][0] == "Bearer t"  # the debug port checks who asks
    dead = f"http://127.0.0.1:{_closed_port()}"
    assert main(["--kubeconfig", kubeconfig, "explain", "ml/x", "--extender-url", dead]) == 1
    assert capsys.readouterr().err.startswith(f"error: asking the extender at {dead}: ")


def test_the_default_namespace_comes_from_the_context(tmp_path: Path, http: FakeHttp) -> None:
    """The current context's namespace, another context's (none: default), or default when unreadable."""
    assert _reader(tmp_path, http).default_namespace() == "team-a"
    assert _reader(tmp_path, http, context="other").default_namespace() == "default"
    assert (
        KubeReader(str(tmp_path / "missing"), None, "linkpack-system", None).default_namespace() == "default"
    )


def test_credentials_come_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--kubeconfig, then $KUBECONFIG, then ~/.kube/config, else None for in-cluster credentials."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert kubeconfig_path(None) is None
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert kubeconfig_path(None) == str(tmp_path / ".kube" / "config")
    monkeypatch.setenv("KUBECONFIG", "/a:/b")
    assert kubeconfig_path(None) == "/a:/b"
    assert kubeconfig_path("/explicit") == "/explicit"


def test_an_unreadable_kubeconfig_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kubeconfig without a usable context ends in one `error:` line on stderr and exit status 1."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    assert main(["--kubeconfig", str(empty), "nodes"]) == 1
    assert capsys.readouterr().err.startswith("error: cannot load Kubernetes credentials:")


def test_bad_resource_settings_are_a_clean_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed $LINKPACK_UNITS_PER_GPU or resource name is reported by the contract's reader."""
    monkeypatch.setenv("LINKPACK_UNITS_PER_GPU", "lots")
    kubeconfig = _kubeconfig(tmp_path, f"http://127.0.0.1:{_closed_port()}")
    assert main(["--kubeconfig", kubeconfig, "nodes"]) == 1
    assert capsys.readouterr().err == "error: LINKPACK_UNITS_PER_GPU='lots': expected a whole number\n"
    monkeypatch.delenv("LINKPACK_UNITS_PER_GPU")
    monkeypatch.setenv("LINKPACK_RESOURCE_GPU", "gpu")
    assert main(["--kubeconfig", kubeconfig, "pods"]) == 1
    assert "LINKPACK_RESOURCE_GPU='gpu': expected a domain-qualified name" in capsys.readouterr().err


def test_explain_without_a_token_says_how_to_get_one(
    tmp_path: Path, http: FakeHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubeconfig without a bearer token (client certificates) gets a clear error, not a 401 page;
    $LINKPACK_TOKEN supplies one."""
    path = tmp_path / "cert-kubeconfig.yaml"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{http.url}"}}}}]
users: [{{name: u, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: u}}}}]
current-context: fake
"""
    )
    monkeypatch.delenv("LINKPACK_TOKEN", raising=False)
    reader = KubeReader(str(path), None, "linkpack-system", None)
    with pytest.raises(PluginError, match="LINKPACK_TOKEN"):
        reader.explain("ml", "trainer")
    monkeypatch.setenv("LINKPACK_TOKEN", "from-env")
    http.routes[f"{PROXY}/debug/explain/ml/trainer"] = (200, bound_doc())
    assert reader.explain("ml", "trainer").status == 200
    assert http.tokens[-1][1] == "Bearer from-env"


def test_explain_against_a_plain_http_extender_needs_no_credentials(
    http: FakeHttp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's extender serves without authentication on plain HTTP: with no kubeconfig and no
    $LINKPACK_TOKEN, explain asks it without a token instead of failing."""
    monkeypatch.delenv("LINKPACK_TOKEN", raising=False)
    http.routes["/debug/explain/ml/trainer"] = (200, bound_doc())
    missing = str(tmp_path / "no-kubeconfig")
    assert main(["--kubeconfig", missing, "explain", "ml/trainer", "--extender-url", http.url]) == 0
    assert capsys.readouterr().out.startswith("Pod ml/trainer: bound")
    assert http.tokens[-1] == ("", "")
