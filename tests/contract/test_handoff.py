"""The hand-off rules both the extender and the node agent apply (`contract.handoff`)."""

from __future__ import annotations

import pytest

from contract.gpu_topology import GpuTopologyError, TopologyStatus, decode_status, encode_status
from contract.handoff import (
    HeldPod,
    NodeHolds,
    admits_pods,
    decode_holds,
    encode_holds,
    held_outside,
    released_by_node,
    revision_at_least,
)
from contract.pods import PodRef
from topology.scheduling import GpuGrant

A = PodRef("ml", "a", "uid-a")
GPU0 = GpuGrant(0, "GPU-0", whole=True)
SHARE1 = GpuGrant(1, "GPU-1", whole=False, memory_mib=4000, units=25)


def test_a_departed_pod_is_released_only_after_the_node_looked_and_no_longer_holds_it() -> None:
    """The node's look must be at or after the departure the extender saw, and not list the pod."""
    held = NodeHolds("120", (HeldPod("ml", "a", "uid-a", (GPU0,)),))
    assert not released_by_node(held, A, "100")  # still held
    assert not released_by_node(NodeHolds("99"), A, "100")  # looked before the departure
    assert released_by_node(NodeHolds("100"), A, "100")
    assert released_by_node(None, A, "100")  # the node reports no holds: not waited for


def test_a_held_pod_is_matched_by_uid_or_by_name_when_the_node_does_not_know_the_uid() -> None:
    """A re-created pod of the same name is another incarnation; a name-only hold covers any."""
    assert NodeHolds("1", (HeldPod("ml", "a", "", ()),)).holds(A)
    assert not NodeHolds("1", (HeldPod("ml", "a", "uid-new", ()),)).holds(A)
    assert not NodeHolds("1", (HeldPod("ml", "b", "uid-a", ()),)).holds(A)


def test_revisions_compare_as_numbers_and_unknown_ones_are_never_late_enough() -> None:
    """etcd revisions are numbers; anything else cannot prove an order."""
    assert revision_at_least("10", "9") and not revision_at_least("9", "10")
    assert not revision_at_least("abc", "9") and revision_at_least("", "")


def test_held_grants_outside_the_ledger_still_count() -> None:
    """Pods the ledger carries are counted there; the others' held GPUs are added."""
    holds = NodeHolds(
        "5",
        (
            HeldPod("ml", "a", "uid-a", (GPU0,)),
            HeldPod("ml", "gone", "", (SHARE1,)),
            HeldPod("ml", "c", "", (GPU0,)),
        ),
    )
    ledger = {"uid-a": ("ml/a", (GPU0,)), "uid-c": ("ml/c", (GPU0,))}
    assert held_outside(holds, ledger) == (SHARE1,)
    assert held_outside(None, {}) == ()


def test_gpus_held_beyond_a_pods_ledger_entry_count_too() -> None:
    """After the node swapped two pods' records, each holds a GPU its ledger entry does not name."""
    gpu1 = GpuGrant(1, "GPU-1", whole=True)
    holds = NodeHolds("5", (HeldPod("ml", "a", "uid-a", (gpu1,)),))
    assert held_outside(holds, {"uid-a": ("ml/a", (GPU0,))}) == (gpu1,)


def test_holds_round_trip_through_the_status_and_bad_input_names_the_field() -> None:
    """Encoded into the GpuTopology status and decoded back; malformed holds are errors."""
    holds = NodeHolds("42", (HeldPod("ml", "a", "uid-a", (GPU0, SHARE1)),), admitting=False)
    assert decode_holds(encode_holds(holds)) == holds
    status = TopologyStatus(gpu_count=2, holds=holds)
    assert decode_status(encode_status(status)).holds == holds
    assert decode_status(encode_status(TopologyStatus())).holds is None
    with pytest.raises(GpuTopologyError, match=r"held.pods\[0\]"):
        decode_status({"held": {"revision": "1", "pods": [{"name": 3}]}})
    with pytest.raises(GpuTopologyError, match="admitting"):
        decode_status({"held": {"revision": "1", "admitting": "yes"}})


def test_a_node_not_admitting_takes_no_new_pods() -> None:
    """Absent holds (an older agent) admit; `admitting: false` does not."""
    assert admits_pods(None) and admits_pods(NodeHolds("1"))
    assert not admits_pods(NodeHolds("1", admitting=False))
