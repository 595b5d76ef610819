"""The GpuTopology object: what the node agent writes is what the extender and the CLI read."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.gpu_topology import (
    GpuHealthEntry,
    GpuTopologyError,
    TopologyStatus,
    _checked_health,
    as_published,
    decode_gpu_topology,
    decode_status,
    encode_status,
    published_hash,
    topology_object,
)
from contract.keys import TOPOLOGY_API_VERSION, TOPOLOGY_KIND
from topology.catalog import load_machine
from topology.codec import content_hash

pytestmark = pytest.mark.timeout(30)


def _status() -> TopologyStatus:
    return TopologyStatus(
        gpu_health=(
            GpuHealthEntry(0, "GPU-a", True),
            GpuHealthEntry(
                1, "GPU-b", False, "XID 79: GPU has fallen off the bus", "2026-12-01T00:00:00Z", "fatal"
            ),
        ),
        gpu_count=2,
        agent_version="0.1.0",
        mps_active=True,
        cordon_problems=("linkpack.io/cordoned-gpus: entry 2 'x' is not a GPU UUID",),
        heartbeat="2026-12-01T00:00:30Z",
    )


def test_status_round_trips() -> None:
    """Every field of the status survives encoding and decoding, heartbeat included."""
    assert decode_status(encode_status(_status())) == _status()


def test_status_without_heartbeat_is_what_change_is_judged_on() -> None:
    """The heartbeat can be left out so that two statuses differing only in time compare equal."""
    doc = encode_status(_status(), with_heartbeat=False)
    assert "heartbeat" not in doc
    assert doc["gpuCount"] == 2 and doc["mps"] == {"active": True}


def test_an_absent_status_is_empty() -> None:
    """A GpuTopology whose agent has not written a status yet reads as all-healthy, no MPS."""
    assert decode_status(None) == TopologyStatus()
    assert decode_status({}).unhealthy == frozenset()


@pytest.mark.parametrize(
    ("status", "path"),
    [
        ({"gpuHealth": "all good"}, "status.gpuHealth"),
        ({"gpuHealth": [{"index": 0}]}, "status.gpuHealth[0]"),
        ({"gpuHealth": [{"index": "0", "healthy": True}]}, "status.gpuHealth[0].index"),
        ({"gpuHealth": [{"index": 0, "healthy": "yes"}]}, "status.gpuHealth[0].healthy"),
        ({"gpuCount": -1}, "status.gpuCount"),
        ({"mps": {"active": 1}}, "status.mps.active"),
        ({"cordonProblems": [3]}, "status.cordonProblems[0]"),
    ],
)
def test_malformed_status_names_the_field(status: dict[str, Any], path: str) -> None:
    """A malformed status is an error naming the node and the field, never a silent default."""
    with pytest.raises(GpuTopologyError, match=re.escape(f"GpuTopology node-a: {path}")):
        decode_status(status, "node-a")


def test_object_round_trips_through_the_codec() -> None:
    """The object the agent writes decodes to the same topology, hash and status."""
    topology = load_machine("dgx-a100")
    obj = topology_object("node-a", topology, resource_version="12")
    assert obj["apiVersion"] == TOPOLOGY_API_VERSION and obj["kind"] == TOPOLOGY_KIND
    assert published_hash(obj) == content_hash(topology)
    obj["status"] = encode_status(_status())
    decoded = decode_gpu_topology(obj)
    assert decoded.node == "node-a" and decoded.topology == topology
    assert decoded.content_hash == content_hash(topology)
    assert decoded.status.unhealthy == frozenset({1}) and decoded.status.mps_active
    assert decoded.resource_version == "12"


def test_a_bad_spec_is_reported_with_the_node() -> None:
    """A spec the topology codec refuses is a GpuTopologyError naming the node."""
    with pytest.raises(GpuTopologyError, match="GpuTopology node-b: spec"):
        decode_gpu_topology({"metadata": {"name": "node-b"}, "spec": {"schemaVersion": "nope"}})


def test_as_published_marks_unhealthy_gpus() -> None:
    """A directly described node carries its unhealthy GPUs and GPU count in its status."""
    published = as_published("n", load_machine("dgx-a100"), unhealthy=frozenset({2}))
    assert published.status.unhealthy == frozenset({2})
    assert published.status.gpu_count == 8


def test_an_allocation_written_with_the_earlier_mps_name_reads_as_hard_mps() -> None:
    """Records committed before the levels were renamed ("mps") keep working as hard-mps."""
    from contract.allocation import Enforcement, decode_allocation, encode_allocation

    text = (
        '{"enforcement":"mps","generation":1,"gpus":[{"index":0,"memoryMiB":1024,"migUuid":"","units":10,'
        '"uuid":"GPU-a","whole":false}],"node":"n","resources":{},"schema":"linkpack.io/allocation/v1"}'
    )
    allocation = decode_allocation(text)
    assert allocation.enforcement is Enforcement.HARD_MPS
    assert '"enforcement":"hard-mps"' in encode_allocation(allocation)


_entry_values = st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() | st.text(max_size=6)
_entries = st.dictionaries(
    st.sampled_from(["index", "uuid", "healthy", "reason", "since", "severity", "cordoned", "other"]),
    _entry_values,
) | st.builds(
    lambda index, healthy, cordoned, text: {
        "index": index, "uuid": text, "healthy": healthy, "reason": text, "since": "", "severity": text,
        "cordoned": cordoned,
    },
    st.integers(0, 64), st.booleans(), st.booleans(), st.text(max_size=6),
)  # fmt: skip


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(_entries | _entry_values, max_size=3))
def test_gpu_health_entries_decode_as_the_field_by_field_checks_do(entries: list[Any]) -> None:
    """Random gpuHealth entries (well-formed ones, and ones with missing fields or values of any
    JSON type): the quick path for the usual entry gives exactly what the checked path gives, the
    same entry or the same error naming the entry's field."""

    def outcome(decode: Any) -> Any:
        try:
            return decode()
        except GpuTopologyError as exc:
            return f"GpuTopologyError: {exc}"

    status = {"gpuHealth": entries}
    checked = [
        outcome(lambda e=e, i=i: _checked_health(e, f"GpuTopology n: status.gpuHealth[{i}]"))
        for i, e in enumerate(entries)
    ]
    first_error = next((c for c in checked if isinstance(c, str)), None)
    decoded = outcome(lambda: decode_status(status, "n"))
    if first_error is None:
        assert decoded.gpu_health == tuple(checked)
    else:
        assert decoded == first_error
