"""Fuzzing the extender's three verbs with random and mutated kube-scheduler bodies.

The bodies go where kube-scheduler sends them: over mutual TLS (the test certificates of
`tests.tls_certs`) to the verbs server that ships (`extender.serving.verbs_server.VerbsServer`
serving `extender.serving.verbs.verb_routes`), over the in-memory cluster. Properties: a verb never
answers anything but 200; its answer keeps the wire shape the scheduler decodes; an invalid body
changes no state (no ledger entry, no binding, no change to the cluster snapshot). Seeded and
bounded.
"""

from __future__ import annotations

import copy
import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.gpu_topology import as_published
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.serving.verbs import verb_routes
from extender.serving.verbs_server import VerbsServer, server_tls
from extender.state.snapshot import NodeFacts
from tests.support.machines import hgx_h100, rtx3090_two_socket
from tests.support.resources import GPU
from tests.tls_certs import TlsSet, issue_tls_set

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent
GOLDEN = HERE.parent / "extender" / "golden"
CORPUS = HERE / "corpus" / "extender_verbs"
EXAMPLES = 150

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["nv-node", "pcie-node", "bare-node", "linkpack", GPU, "2", "1Gi", "-1", "500m"]),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


def _seeds() -> list[tuple[str, Any]]:
    found = []
    for path in sorted([*GOLDEN.glob("*.json"), *CORPUS.glob("*.json")]):
        verb = path.stem.split("-")[0]
        found.append((verb, json.loads(path.read_text())))
    return found


SEEDS = _seeds()


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, Any]:
    """A seed body with one to three of its values replaced, deleted or retyped."""
    verb, seed = draw(st.sampled_from(SEEDS))
    doc = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = draw(json_values)
    return verb, doc


def _service() -> tuple[ExtenderService, InMemoryCluster]:
    config = ExtenderConfig()
    cluster = InMemoryCluster(config)
    cluster.add_node(NodeFacts("nv-node"), as_published("nv-node", hgx_h100()))
    cluster.add_node(NodeFacts("pcie-node"), as_published("pcie-node", rtx3090_two_socket()))
    cluster.add_node(NodeFacts("golden-a"), as_published("golden-a", rtx3090_two_socket("a")))
    cluster.add_node(NodeFacts("bare-node"), None)
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    return service, cluster


SERVICE, CLUSTER = _service()


class VerbsClient:
    """kube-scheduler's side of the verbs: one kept-alive HTTPS connection with the scheduler's
    client certificate, opened again if the server closed it."""

    def __init__(self, port: int, tls: TlsSet) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(tls.server_ca))
        self.context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
        self.conn = self._connect()

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=30, context=self.context)

    def post(self, verb: str, raw: bytes) -> tuple[int, Any]:
        for attempt in (1, 2):
            try:
                self.conn.request("POST", f"/{verb}", body=raw, headers={"Content-Type": "application/json"})
                reply = self.conn.getresponse()
                return reply.status, json.loads(reply.read())
            except (http.client.RemoteDisconnected, ConnectionError, http.client.CannotSendRequest):
                self.conn.close()
                self.conn = self._connect()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def verbs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerbsClient]:
    """The shipped verbs server over SERVICE, with mutual TLS as in `extender.__main__.servers`."""
    tls = issue_tls_set(tmp_path_factory.mktemp("verbs-tls"))
    context = server_tls(str(tls.server_cert), str(tls.server_key), str(tls.client_ca))
    server = VerbsServer(verb_routes(SERVICE), "127.0.0.1", 0, context)
    server.start()
    client = VerbsClient(server.port, tls)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def _state() -> tuple[Any, ...]:
    snapshot = SERVICE.store.snapshot()
    return (snapshot.ledgers(), [p["spec"].get("nodeName") for p in CLUSTER.pods()])


def _check_filter(answer: Any) -> None:
    assert isinstance(answer, dict)
    assert set(answer) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert isinstance(answer["Error"], str)
    assert answer["NodeNames"] is None or all(isinstance(n, str) for n in answer["NodeNames"])
    assert all(isinstance(v, str) for v in (answer["FailedNodes"] or {}).values())


def _check_prioritize(answer: Any) -> None:
    assert isinstance(answer, list)
    for item in answer:
        assert set(item) == {"Host", "Score"} and isinstance(item["Host"], str)
        assert isinstance(item["Score"], int) and 0 <= item["Score"] <= 10


def _check_bind(answer: Any) -> None:
    assert isinstance(answer, dict) and set(answer) == {"Error"} and isinstance(answer["Error"], str)


CHECKS = {"filter": _check_filter, "prioritize": _check_prioritize, "bind": _check_bind}


def _call(verbs: VerbsClient, verb: str, body: Any) -> None:
    """`body` as JSON to the verb: answered 200, in shape, and without a change of state unless
    it bound a pod."""
    before = _state()
    status, answer = verbs.post(verb, json.dumps(body).encode())
    assert status == 200, (verb, body, answer)
    CHECKS[verb](answer)
    if verb == "bind" and answer["Error"] == "":
        return  # a valid bind may change state (no seed binds a pod that exists)
    assert _state() == before, f"{verb} changed state on {body!r}"


@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.sampled_from(sorted(CHECKS)), json_values)
def test_random_bodies_are_answered_in_shape_and_change_nothing(
    verbs: VerbsClient, verb: str, body: Any
) -> None:
    """Arbitrary JSON to any verb: an answer of the right shape, no server error, no state change."""
    _call(verbs, verb, body)


@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(mutated())
def test_mutated_scheduler_bodies_are_answered_in_shape_and_change_nothing(
    verbs: VerbsClient, case: tuple[str, Any]
) -> None:
    """Real kube-scheduler payloads with fields dropped, replaced or retyped: the same properties."""
    verb, body = case
    _call(verbs, verb, body)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(CHECKS)), st.binary(max_size=300))
def test_raw_bytes_over_http_never_get_a_server_error(verbs: VerbsClient, verb: str, raw: bytes) -> None:
    """Whatever bytes arrive as the body, the server answers 200 with the verb's error shape."""
    before = _state()
    status, answer = verbs.post(verb, raw)
    assert status == 200
    CHECKS[verb](answer)
    assert _state() == before


def test_every_corpus_entry_replays(verbs: VerbsClient) -> None:
    """Each kept corpus entry still gets a well-formed answer and changes nothing."""
    for verb, body in SEEDS:
        if verb == "bind":
            body = {**body, "PodUID": "not-a-pod"} if isinstance(body, dict) else body
        _call(verbs, verb, body)
