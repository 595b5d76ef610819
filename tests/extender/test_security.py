"""Only the scheduler drives the verbs, only RBAC-permitted identities read the debug endpoints,
and bind lends the extender's binding right to nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from extender.__main__ import check_tls, servers
from extender.config import ConfigError, ExtenderConfig, TlsFiles, config_from_env
from extender.debug.access import DebugAccess
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService
from extender.serving.app import create_debug_app
from extender.state.cluster_api import Identity
from tests.support.pods import filter_args, pod_manifest
from tests.tls_certs import TlsSet, issue_tls_set

pytestmark = pytest.mark.timeout(60)

ALICE = Identity("alice", "uid-alice", ("oncall",))
BOB = Identity("bob", "uid-bob")


class CountingReviewer:
    """The in-memory cluster's reviews, counted (to see the cache at work)."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        self.cluster = cluster
        self.calls = 0

    def review_token(self, token: str) -> Identity | None:
        self.calls += 1
        return self.cluster.review_token(token)

    def review_access(
        self, identity: Identity, verb: str, group: str, resource: str, sub: str
    ) -> tuple[bool, str]:
        self.calls += 1
        return self.cluster.review_access(identity, verb, group, resource, sub)


@pytest.fixture
def reviewer(cluster: InMemoryCluster) -> CountingReviewer:
    cluster.tokens["alice-token"] = (ALICE, frozenset({"topology", "explain", "what-if"}))
    cluster.tokens["bob-token"] = (BOB, frozenset({"explain"}))
    return CountingReviewer(cluster)


@pytest.fixture
def debug_http(service: ExtenderService, reviewer: CountingReviewer) -> TestClient:
    return TestClient(create_debug_app(service, DebugAccess(reviewer)))


# ----------------------------------------------------------------------------- debug access


def test_an_unauthenticated_debug_read_is_refused(debug_http: TestClient) -> None:
    """Without a bearer token the topology of every node stays unreadable (401, and how to authenticate)."""
    reply = debug_http.get("/debug/topology")
    assert reply.status_code == 401 and "Authorization: Bearer" in reply.json()["error"]
    assert reply.headers["www-authenticate"].startswith("Bearer")


def test_a_token_the_api_server_rejects_is_refused(debug_http: TestClient) -> None:
    """A token the TokenReview does not authenticate gets 401."""
    reply = debug_http.get("/debug/topology", headers={"Authorization": "Bearer forged"})
    assert reply.status_code == 401 and "TokenReview" in reply.json()["error"]


def test_an_identity_without_the_rbac_permission_is_refused_by_name(debug_http: TestClient) -> None:
    """Bob may explain pods but not read node topologies or ask what-if: 403 names user and subresource."""
    bob = {"Authorization": "Bearer bob-token"}
    reply = debug_http.get("/debug/topology", headers=bob)
    assert reply.status_code == 403
    assert "bob may not get debug/topology in API group linkpack.io" in reply.json()["error"]
    assert debug_http.post("/debug/what-if", headers=bob, json=pod_manifest(gpus=1)).status_code == 403
    assert debug_http.get("/debug/explain/ml/nobody", headers=bob).status_code == 404  # allowed, unknown pod


def test_a_permitted_identity_reads_and_answers_are_cached(
    debug_http: TestClient, reviewer: CountingReviewer
) -> None:
    """Alice reads the overview; the second read within the TTL costs no API review."""
    alice = {"Authorization": "Bearer alice-token"}
    assert debug_http.get("/debug/topology", headers=alice).status_code == 200
    calls = reviewer.calls
    assert debug_http.get("/debug/topology", headers=alice).status_code == 200
    assert reviewer.calls == calls


def test_the_token_may_come_through_the_api_servers_service_proxy(debug_http: TestClient) -> None:
    """The API server's service proxy drops Authorization, so X-Linkpack-Authorization is read too."""
    reply = debug_http.get("/debug/topology", headers={"X-Linkpack-Authorization": "Bearer alice-token"})
    assert reply.status_code == 200


def test_the_debug_app_serves_no_verbs(debug_http: TestClient) -> None:
    """The debug port cannot be used to bind: the verbs are not routed there at all."""
    reply = debug_http.post("/bind", headers={"Authorization": "Bearer alice-token"}, json={})
    assert reply.status_code == 404


# ----------------------------------------------------------------------------- bind refusals


def _created(cluster: InMemoryCluster, pod: dict) -> dict:
    return cluster.create_pod(pod)["metadata"]


def test_bind_without_a_pod_uid_is_refused(service: ExtenderService, cluster: InMemoryCluster) -> None:
    """An empty UID used to skip the re-created-pod check; now it is refused outright."""
    meta = _created(cluster, pod_manifest("no-uid", gpus=1))
    reply = service.bind({"PodName": meta["name"], "PodNamespace": "ml", "PodUID": "", "Node": "nv-node"})
    assert "names no pod UID" in reply["Error"]
    assert cluster.read_pod("ml", "no-uid").tracked.node_name == ""


def test_bind_of_another_schedulers_pod_is_refused(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """A pod of the default scheduler cannot be bound through the extender, nor filtered onto nodes."""
    pod = pod_manifest("theirs", gpus=1)
    pod["spec"]["schedulerName"] = "default-scheduler"
    meta = _created(cluster, pod)
    reply = service.bind(
        {"PodName": "theirs", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "nv-node"}
    )
    assert "is for scheduler 'default-scheduler', not 'linkpack'" in reply["Error"]
    filtered = service.filter(filter_args(cluster.read_pod("ml", "theirs").manifest, ["nv-node"]))
    assert (
        filtered["NodeNames"] == []
        and "default-scheduler" in filtered["FailedAndUnresolvableNodes"]["nv-node"]
    )


def test_bind_of_a_pod_without_gpus_is_refused(service: ExtenderService, cluster: InMemoryCluster) -> None:
    """The extender's cluster-wide binding right is not lent to pods it does not place."""
    pod = pod_manifest("cpu-only")
    meta = _created(cluster, pod)
    reply = service.bind(
        {"PodName": "cpu-only", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "nv-node"}
    )
    assert "asks for no GPU resource" in reply["Error"]
    assert cluster.read_pod("ml", "cpu-only").tracked.node_name == ""


# ----------------------------------------------------------------------------- TLS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tls_set(tmp_path_factory: pytest.TempPathFactory) -> TlsSet:
    return issue_tls_set(tmp_path_factory.mktemp("tls"))


@contextlib.contextmanager
def _serving(service: ExtenderService, reviewer: CountingReviewer, tls: TlsSet) -> Iterator[ExtenderConfig]:
    files = TlsFiles(str(tls.server_cert), str(tls.server_key), str(tls.client_ca))
    config = replace(
        service.config,
        host="127.0.0.1",
        port=_free_port(),
        debug_port=_free_port(),
        ops_port=_free_port(),
        tls=files,
    )
    running = servers(service, reviewer, config, check_tls(files), "warning")
    for server in running:
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # (older uvicorn)
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        await asyncio.gather(*(s.serve() for s in running))

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not all(s.started for s in running):
        assert time.monotonic() < deadline, "servers did not start"
        time.sleep(0.05)
    try:
        yield config
    finally:
        for s in running:
            s.should_exit = True
        thread.join(timeout=10)
        loop.close()


def _client(tls: TlsSet, cert: Path | None, key: Path | None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(tls.server_ca))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return httpx.Client(verify=context, timeout=5)


def test_the_verbs_need_the_schedulers_client_certificate(
    service: ExtenderService, reviewer: CountingReviewer, tls_set: TlsSet
) -> None:
    """Over real sockets: no client certificate, or one from another CA, gets no TLS session;
    the scheduler's certificate gets the verbs; health is plain HTTP on its own port."""
    with _serving(service, reviewer, tls_set) as config:
        url = f"https://127.0.0.1:{config.port}/filter"
        body = filter_args(pod_manifest(gpus=1), ["nv-node"])
        with _client(tls_set, None, None) as anonymous, pytest.raises(httpx.TransportError):
            anonymous.post(url, json=body)
        with (
            _client(tls_set, tls_set.rogue_cert, tls_set.rogue_key) as rogue,
            pytest.raises(httpx.TransportError),
        ):
            rogue.post(url, json=body)
        with _client(tls_set, tls_set.client_cert, tls_set.client_key) as scheduler:
            assert scheduler.post(url, json=body).json()["NodeNames"] == ["nv-node"]
            assert scheduler.get(f"https://127.0.0.1:{config.port}/debug/topology").status_code == 404
        debug = f"https://127.0.0.1:{config.debug_port}/debug/topology"
        with _client(tls_set, None, None) as reader:
            assert reader.get(debug).status_code == 401
            assert reader.get(debug, headers={"Authorization": "Bearer alice-token"}).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{config.ops_port}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{config.ops_port}/filter", timeout=5).status_code in (404, 405)


def test_the_extender_refuses_to_start_without_tls() -> None:
    """No TLS files, half of them, or files that do not exist: a specific error, nothing served."""
    with pytest.raises(ConfigError, match="mutual TLS"):
        check_tls(config_from_env({}).tls)
    with pytest.raises(ConfigError, match="LINKPACK_CLIENT_CA_FILE not set"):
        config_from_env({"LINKPACK_TLS_CERT_FILE": "a", "LINKPACK_TLS_KEY_FILE": "b"})
    with pytest.raises(ConfigError, match="does not exist"):
        check_tls(TlsFiles("/nonexistent.crt", "/nonexistent.key", "/nonexistent-ca.crt"))
