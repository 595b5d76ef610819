"""Fuzz `contract.gpu_topology`: the GpuTopology objects node agents publish and the extender reads.

`decode_gpu_topology` (the whole object) and `decode_status` (its status) take whatever the API
server stores: only GpuTopologyError may escape, naming the node and the field path, and every
valid object decodes to exactly what was encoded.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.gpu_topology import (
    GpuHealthEntry,
    GpuTopologyError,
    PublishedTopology,
    TopologyStatus,
    decode_gpu_topology,
    decode_status,
    encode_status,
    topology_object,
)
from tests.fuzz.contract_support import (
    ContractViolation,
    decode_checked,
    json_values,
    keys,
    mutations,
    names_path,
    render_path,
    tolerating_known_bugs,
)
from tests.fuzz.corpus_support import expectation, read_json, replay_params
from tests.fuzz.fuzz_settings import fuzz
from topology.codec import content_hash
from topology.model import Gpu, GpuLink, LinkKind, MigDevice, MigMode, Nic, NicLink, NodeTopology

counts = st.integers(0, 2**40)
short_text = st.text(max_size=12)
_migs = st.builds(
    MigDevice,
    uuid=short_text,
    profile=short_text,
    gpu_instance_id=counts,
    compute_instance_id=counts,
    memory_mib=counts,
)


@st.composite
def topologies(draw: st.DrawFn) -> NodeTopology:
    indices = sorted(draw(st.sets(st.integers(0, 64), min_size=1, max_size=4)))
    gpus = tuple(
        Gpu(
            index=i,
            uuid=draw(short_text),
            model=draw(st.sampled_from(["H100 80GB HBM3", "A100-SXM4-40GB", "RTX 4090", ""]) | short_text),
            memory_mib=draw(counts),
            pci_bus_id=draw(short_text),
            numa_node=draw(st.none() | st.integers(0, 8)),
            cpu_affinity=draw(st.sampled_from(["", "0-15", "0-63,128-191"])),
            gpu_numa_id=draw(st.none() | st.integers(0, 8)),
            mig_mode=draw(st.sampled_from(MigMode)),
            mig_devices=tuple(draw(st.lists(_migs, max_size=2))),
        )
        for i in indices
    )
    links = []
    for a, b in combinations(indices, 2):
        if draw(st.booleans()):
            kind = draw(st.sampled_from(LinkKind))
            links.append(GpuLink(a, b, kind, draw(st.integers(1, 18)) if kind is LinkKind.NV else 0))
    nics = tuple(Nic(i, draw(short_text)) for i in sorted(draw(st.sets(st.integers(0, 16), max_size=2))))
    nic_links = tuple(
        NicLink(g, n.index, draw(st.sampled_from(LinkKind)))
        for g in indices
        for n in nics
        if draw(st.booleans())
    )
    return NodeTopology(
        gpus=gpus,
        gpu_links=tuple(links),
        nics=nics,
        nic_links=nic_links,
        nvswitch=draw(st.booleans()),
        sources=tuple(draw(st.lists(st.tuples(short_text, short_text), max_size=2))),
        warnings=tuple(draw(st.lists(short_text, max_size=2))),
    )


statuses = st.builds(
    TopologyStatus,
    gpu_health=st.lists(
        st.builds(
            GpuHealthEntry,
            index=counts,
            uuid=short_text,
            healthy=st.booleans(),
            reason=short_text,
            since=short_text,
            severity=st.sampled_from(["", "application", "notice", "needs-reset", "fatal"]),
            cordoned=st.booleans(),
        ),
        max_size=3,
    ).map(tuple),
    gpu_count=counts,
    agent_version=short_text,
    mps_active=st.booleans(),
    cordon_problems=st.lists(short_text, max_size=2).map(tuple),
    heartbeat=short_text,
)
node_names = st.text(min_size=1, max_size=20)


def _object(node: str, topology: NodeTopology, status: TopologyStatus | None, rv: str) -> dict[str, Any]:
    obj = topology_object(node, topology, rv)
    if status is not None:
        obj["status"] = encode_status(status)
    return json.loads(json.dumps(obj))  # as the API server returns it


def decode_object(obj: Any, path: tuple[str | int, ...] = (), op: str = "") -> PublishedTopology | None:
    """The decoded object, or None when refused properly: the message starts with `GpuTopology`
    and, when the value at `path` was retyped, names that path (or, in the spec, the content hash
    the change no longer matches)."""

    def problem(message: str) -> str | None:
        if not message.startswith("GpuTopology"):
            return "does not start with 'GpuTopology'"
        hash_mismatch = path[:1] == ("spec",) and "contentHash" in message
        if op == "retype" and not names_path(message, path) and not hash_mismatch:
            return f"does not name the retyped field {render_path(path)}"
        return None

    value, _ = decode_checked(lambda: decode_gpu_topology(obj), GpuTopologyError, problem, obj)
    return value


def decode_status_checked(raw: Any, path: tuple[str | int, ...] = (), op: str = "") -> TopologyStatus | None:
    def problem(message: str) -> str | None:
        if not message.startswith("GpuTopology n: status"):
            return "does not start with 'GpuTopology n: status'"
        if op == "retype" and not names_path(message, path):
            return f"does not name the retyped field {render_path(path)}"
        return None

    value, _ = decode_checked(lambda: decode_status(raw, "n"), GpuTopologyError, problem, raw)
    return value


# ---------------------------------------------------------------------- round trips


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(node_names, topologies(), st.none() | statuses, st.text(max_size=8))
def test_gpu_topology_round_trips(
    node: str, topology: NodeTopology, status: TopologyStatus | None, rv: str
) -> None:
    """Every object the agent would publish decodes to its node, topology, hash, status and version."""
    published = decode_object(_object(node, topology, status, rv))
    assert published is not None
    assert (published.node, published.topology, published.resource_version) == (node, topology, rv)
    assert published.content_hash == content_hash(topology)
    assert published.status == (status or TopologyStatus())


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(statuses)
def test_status_round_trips(status: TopologyStatus) -> None:
    """Every status decodes from its encoding to an equal status."""
    assert decode_status_checked(json.loads(json.dumps(encode_status(status)))) == status


# ---------------------------------------------------------------------- mutations and junk


@pytest.mark.timeout(120)
@fuzz(max_examples=200)
@given(st.data())
def test_mutated_gpu_topologies_are_refused_naming_the_field(data: st.DataObject) -> None:
    """One place of a valid object (metadata, spec, status) changed: decoded or refused by path."""
    obj = _object(data.draw(node_names), data.draw(topologies()), data.draw(statuses), "1")
    mutation = data.draw(mutations(obj, root=False))  # the decoder takes a mapping
    tolerating_known_bugs("gpu-topology", lambda: decode_object(mutation.doc, mutation.path, mutation.op))


@pytest.mark.timeout(120)
@fuzz(max_examples=200)
@given(st.data())
def test_mutated_statuses_are_refused_naming_the_field(data: st.DataObject) -> None:
    """One place of a valid status changed: decoded or refused naming the status field."""
    mutation = data.draw(statuses.map(lambda s: json.loads(json.dumps(encode_status(s)))).flatmap(mutations))
    tolerating_known_bugs(
        "gpu-topology-status", lambda: decode_status_checked(mutation.doc, mutation.path, mutation.op)
    )


@pytest.mark.timeout(120)
@fuzz(max_examples=120)
@given(
    st.dictionaries(st.sampled_from(["metadata", "spec", "status"]) | keys, json_values, max_size=4),
    json_values,
)
def test_random_objects_and_statuses_are_refused(obj: dict[str, Any], raw_status: Any) -> None:
    """Random objects where a GpuTopology is expected, and random statuses: decoded or refused."""
    tolerating_known_bugs("gpu-topology", lambda: decode_object(obj))
    tolerating_known_bugs("gpu-topology-status", lambda: decode_status_checked(raw_status))


# ---------------------------------------------------------------------- corpus


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params("gpu-topology", ContractViolation))
def test_gpu_topology_corpus_entry(path: Path) -> None:
    """Each GpuTopology corpus entry keeps the contract; ok- entries decode, err- entries are refused."""
    value = decode_object(read_json(path))
    if expectation(path) == "ok":
        assert value is not None
    elif expectation(path) == "err":
        assert value is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params("gpu-topology-status", ContractViolation))
def test_status_corpus_entry(path: Path) -> None:
    """Each status corpus entry keeps the contract; ok- entries decode, err- entries are refused."""
    value = decode_status_checked(read_json(path))
    if expectation(path) == "ok":
        assert value is not None
    elif expectation(path) == "err":
        assert value is None
