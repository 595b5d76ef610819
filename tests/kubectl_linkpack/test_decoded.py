"""Decoding the API objects into the plugin's records, with the contract's rules."""

from __future__ import annotations

import datetime as dt

from contract.cordons import Cordons, parse_cordons
from contract.gpu_topology import decode_gpu_topology
from contract.ledger import ledger_from_config_map
from contract.node_state import build_node_state
from kubectl_linkpack.decoded import (
    NodeReport,
    cordons_by_node,
    ledgers_from,
    node_cordons,
    node_report,
    parse_time,
    pod_allocations,
)
from tests.support.nodes import node_object

from .fakes import (
    BAD,
    BROKEN,
    DRAINED,
    DRAINED_LEDGER,
    GONE,
    LEDGER,
    LOST,
    NODE,
    SHARE,
    STRANGER,
    TOPOLOGY,
    TYPO,
    UUIDS,
    WHOLE,
    XID,
    FakeReader,
    default_ledgers,
    default_nodes,
    default_pods,
    default_topologies,
)


def _record(name: str, units_per_gpu: int = 100) -> NodeReport:
    ledgers, errors = ledgers_from(default_ledgers().values())
    return node_report(
        default_topologies()[name], cordons_by_node(default_nodes().values()), ledgers, units_per_gpu, errors
    )


def test_a_gpu_topology_object_becomes_a_record_with_its_ledgers_grants() -> None:
    """The record holds the decoded topology, health, heartbeat and the state with the ledger's grants."""
    record = _record(NODE)
    assert record.published is not None and record.published.topology.gpus == TOPOLOGY.gpus
    assert record.heartbeat == dt.datetime(2025, 3, 1, 11, 59, 20, tzinfo=dt.UTC)
    assert record.reason(3) == XID and record.ledger == LEDGER and not record.node_missing
    assert record.state is not None and record.overcommits == ()
    usage = record.state.usage
    assert [u.whole for u in usage] == [True, True, False, False, True, False, False, False]
    assert usage[2].memory_used_mib == 10240 and usage[2].units_used == 25
    assert not usage[3].healthy and usage[5].cordoned


def test_an_upper_case_cordoned_uuid_in_the_node_annotation_cordons_that_gpu() -> None:
    """The Node annotation names GPU 5 in upper case; UUIDs compare case-insensitively, so it is cordoned."""
    assert default_nodes()[NODE]["metadata"]["annotations"]["linkpack.io/cordoned-gpus"] == UUIDS[5].upper()
    record = _record(NODE)
    assert record.state is not None
    assert [i for i, u in enumerate(record.state.usage) if u.cordoned] == [5]
    assert record.cordon_problems == ()


def test_an_unschedulable_node_has_every_gpu_unavailable_as_the_extender_sees_it() -> None:
    """`spec.unschedulable` keeps every GPU out, exactly as the shared builder the extender uses says."""
    record = _record(DRAINED)
    published = decode_gpu_topology(default_topologies()[DRAINED])
    expected, _ = build_node_state(published, DRAINED_LEDGER.grants(), 100, Cordons(), unschedulable=True)
    assert record.unschedulable and record.state == expected
    assert not any(u.usable for u in record.state.usage)
    assert record.state.usage[1].whole and not record.state.usage[0].healthy


def test_problems_of_the_cordon_annotation_are_kept_and_the_valid_entries_honoured() -> None:
    """A MIG UUID and a UUID of no GPU of the node are reported; the valid UUID still cordons its GPU."""
    record = _record(TYPO)
    assert record.state is not None
    assert [i for i, u in enumerate(record.state.usage) if u.cordoned] == [7]
    problems = record.cordon_problems
    assert len(problems) == 2
    assert "is a MIG instance; cordon its parent GPU instead" in problems[0]
    assert problems[1] == f"linkpack.io/cordoned-gpus names {STRANGER}, which is not a GPU of this node"


def test_a_malformed_gpu_topology_is_a_record_with_the_error() -> None:
    """A spec the codec rejects gives a record without a topology that says why, and keeps the heartbeat."""
    record = _record(BAD)
    assert record.published is None and record.state is None
    assert record.error.startswith("GpuTopology gpu-bad: spec: schemaVersion")
    assert record.heartbeat is not None


def test_a_topology_without_a_node_object_is_flagged_and_nothing_is_cordoned() -> None:
    """No Node object: no cordons, not unschedulable, and `node_missing` says so."""
    record = _record(LOST)
    assert record.node_missing and record.node_cordons is None and record.heartbeat is None
    assert record.state is not None and all(u.usable for u in record.state.usage)
    unknown = node_report(default_topologies()[LOST], None, {}, 100)
    assert not unknown.node_missing and unknown.node_cordons is None


def test_node_facts_read_the_annotation_and_spec() -> None:
    """The cordon annotation goes through `contract.cordons`, `spec.unschedulable` is read as a flag."""
    facts = node_cordons(node_object("n", cordons=f" {UUIDS[0].upper()} ,{UUIDS[1]}", unschedulable=True))
    assert facts.name == "n" and facts.unschedulable
    assert facts.cordons == parse_cordons(f"{UUIDS[0]},{UUIDS[1]}")
    assert node_cordons({"metadata": None, "spec": "odd"}) == node_cordons({})
    assert not node_cordons({}).unschedulable and node_cordons({}).cordons == Cordons()


def test_ledgers_and_pod_annotations_are_read() -> None:
    """Ledgers are keyed by node and a broken one is reported; pods without the annotation are skipped."""
    ledgers, errors = ledgers_from(FakeReader().ledgers())
    assert ledgers[NODE] == LEDGER and ledgers[GONE].entries == ()
    assert ledgers[DRAINED] == ledger_from_config_map(default_ledgers()[DRAINED])
    assert set(errors) == {BROKEN} and "expected a JSON object" in errors[BROKEN]
    pods = {p.ref.name: p for p in pod_allocations(default_pods())}
    assert set(pods) == {"train", "infer", "stray", "broken", "job"}
    assert pods["train"].allocation == WHOLE and pods["train"].ref.uid == "uid-train"
    assert pods["infer"].allocation == SHARE and pods["infer"].node_name == "" and not pods["infer"].finished
    assert pods["broken"].allocation is None and "not JSON" in pods["broken"].error


def test_times_are_read_leniently() -> None:
    """RFC 3339 with Z or an offset is read, a zone-less time is UTC, anything else is unknown."""
    assert parse_time("2025-03-01T11:59:20Z") == dt.datetime(2025, 3, 1, 11, 59, 20, tzinfo=dt.UTC)
    assert parse_time("2025-03-01T12:59:20+01:00") == dt.datetime(2025, 3, 1, 11, 59, 20, tzinfo=dt.UTC)
    assert parse_time("2025-03-01T11:59:20") == dt.datetime(2025, 3, 1, 11, 59, 20, tzinfo=dt.UTC)
    assert parse_time("yesterday") is None and parse_time("") is None and parse_time(5) is None
