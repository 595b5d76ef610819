"""Fuzzing the extender's three verbs with random and mutated kube-scheduler bodies.

Properties, over the in-memory cluster and through the HTTP app: a verb never raises and never
answers 5xx; its answer keeps the wire shape the scheduler decodes; an invalid body changes no
state (no ledger entry, no binding, no change to the cluster snapshot). Seeded and bounded.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.gpu_topology import as_published
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.serving.app import create_app
from extender.state.snapshot import NodeFacts
from tests.extender.conftest import hgx_h100, two_socket_pcie

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
    st.sampled_from(
        ["nv-node", "pcie-node", "bare-node", "linkpack", "nvidia.com/gpu", "2", "1Gi", "-1", "500m"]
    ),
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
    cluster.add_node(NodeFacts("pcie-node"), as_published("pcie-node", two_socket_pcie()))
    cluster.add_node(NodeFacts("golden-a"), as_published("golden-a", two_socket_pcie("a")))
    cluster.add_node(NodeFacts("bare-node"), None)
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    return service, cluster


SERVICE, CLUSTER = _service()
HTTP = TestClient(create_app(SERVICE), raise_server_exceptions=True)


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


def _call(verb: str, body: Any) -> None:
    before = _state()
    answer = getattr(SERVICE, verb)(body)
    CHECKS[verb](answer)
    if verb == "bind" and answer["Error"] == "":
        return  # a valid bind may change state (no seed binds a pod that exists)
    assert _state() == before, f"{verb} changed state on {body!r}"


@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.sampled_from(sorted(CHECKS)), json_values)
def test_random_bodies_are_answered_in_shape_and_change_nothing(verb: str, body: Any) -> None:
    """Arbitrary JSON to any verb: an answer of the right shape, no exception, no state change."""
    _call(verb, body)


@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(mutated())
def test_mutated_scheduler_bodies_are_answered_in_shape_and_change_nothing(case: tuple[str, Any]) -> None:
    """Real kube-scheduler payloads with fields dropped, replaced or retyped: the same properties."""
    verb, body = case
    _call(verb, body)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(CHECKS)), st.binary(max_size=300))
def test_raw_bytes_over_http_never_get_a_server_error(verb: str, raw: bytes) -> None:
    """Whatever bytes arrive on the wire, the HTTP layer answers 200 with the verb's error shape."""
    before = _state()
    reply = HTTP.post(f"/{verb}", content=raw, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200
    CHECKS[verb](reply.json())
    assert _state() == before


def test_every_corpus_entry_replays() -> None:
    """Each kept corpus entry still gets a well-formed answer and changes nothing."""
    for verb, body in SEEDS:
        if verb == "bind":
            body = {**body, "PodUID": "not-a-pod"} if isinstance(body, dict) else body
        _call(verb, body)
