"""`kubectl linkpack nodes`, `topo` and `pods` on canned objects served by a fake reader."""

from __future__ import annotations

import pytest

from contract.allocation import Allocation, Enforcement
from contract.cordons import parse_cordons
from contract.gpu_topology import decode_gpu_topology
from contract.ledger import Ledger, LedgerEntry
from contract.node_state import build_node_state
from kubectl_linkpack.errors import PluginError
from tests.support.nodes import node_object
from topology.gpu_status import GPU_STATUSES, gpu_status
from topology.scheduling import GpuGrant

from .fakes import (
    BAD,
    DRAINED,
    DRAINED_LEDGER,
    LOST,
    NODE,
    TYPO,
    UUIDS,
    XID,
    FakeReader,
    allocation,
    gpu_topology,
    ledger_object,
    row_of,
    run_cli,
)

HEADERS = ["NODE", "MODEL", "GPUS", "FREE", "SHARED", "WHOLE", "UNHEALTHY", "CORDONED", "FREE-MEM", "PODS"]


def _counts(row: list[str]) -> dict[str, int]:
    return {status: int(row[3 + i]) for i, status in enumerate(GPU_STATUSES)}


# ----------------------------------------------------------------------------- nodes


def test_nodes_shows_counts_memory_heartbeat_and_health() -> None:
    """One line per node: GPU states from the ledger, free memory of usable GPUs, heartbeat age, health."""
    code, text = run_cli("nodes")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split() == [*HEADERS, "HEARTBEAT", "HEALTH"]
    row = row_of(text, NODE)
    free_mib = 2 * 40960 + (40960 - 10240)  # GPUs 6, 7 and what the share leaves on GPU 2
    # GPU 4 is held by the stale entry "gone": the ledger is what the extender counts
    assert row[:11] == [
        NODE,
        "A100-SXM4-40GB",
        "8",
        "2",
        "1",
        "3",
        "1",
        "1",
        f"{free_mib / 1024:.1f}Gi",
        "3",
        "40s",
    ]
    assert " ".join(row[11:]) == f"GPU3: {XID}"


def test_nodes_shows_an_upper_case_cordoned_uuid_as_cordoned() -> None:
    """GPU 5 is named in upper case in the Node annotation and counts as cordoned, not free."""
    reader = FakeReader()
    reader.node_objects[NODE] = node_object(NODE, cordons=f"{UUIDS[5].upper()},{UUIDS[6].upper()}")
    row = row_of(run_cli("nodes", reader=reader)[1], NODE)
    assert _counts(row) == {"free": 1, "shared": 1, "whole": 3, "unhealthy": 1, "cordoned": 2}
    assert row[8] == f"{(40960 + 40960 - 10240) / 1024:.1f}Gi"  # GPU 7 and the rest of GPU 2


def test_nodes_shows_every_gpu_of_an_unschedulable_node_unavailable_as_the_extender_sees_it() -> None:
    """On an unschedulable Node no GPU is free, held or counted as free memory; the states are those of
    the NodeState the shared builder (which the extender uses) gives for that Node."""
    code, text = run_cli("nodes")
    assert code == 0
    row = row_of(text, DRAINED)
    assert _counts(row) == {"free": 0, "shared": 0, "whole": 0, "unhealthy": 1, "cordoned": 7}
    assert row[8] == "0.0Gi" and row[9] == "1"
    assert "node unschedulable: no new placements" in " ".join(row[11:])
    published = decode_gpu_topology(gpu_topology(DRAINED, unhealthy={0: "XID 48"}))
    extender_view, _ = build_node_state(published, DRAINED_LEDGER.grants(), 100, parse_cordons(None), True)
    seen = [gpu_status(u) for u in extender_view.usage]
    assert seen.count("cordoned") == 7 and seen.count("unhealthy") == 1


def test_nodes_reports_bad_objects_without_hiding_the_others() -> None:
    """A malformed GpuTopology, a ledger without a node, a broken ledger and bad cordons are all shown."""
    text = run_cli("nodes")[1]
    lines = text.splitlines()
    bad = row_of(text, BAD)
    assert bad[1:9] == ["-"] * 8 and " ".join(bad[11:]).startswith("GpuTopology gpu-bad: spec: schemaVersion")
    assert " ".join(row_of(text, "gpu-gone")[11:]) == "no GpuTopology (ledger only)"
    assert row_of(text, "gpu-broken")[9] == "?"
    assert " ".join(row_of(text, LOST)[10:]) == "- no Node object"
    assert " ".join(row_of(text, TYPO)[11:]) == "2 cordon annotation problem(s)"
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert warnings[0].startswith("warning: node gpu-typo: linkpack.io/cordoned-gpus: entry 2 'MIG-")
    assert "which is not a GPU of this node" in warnings[1]
    assert warnings[2].startswith("warning: ledger ConfigMap linkpack-ledger-gpu-broken is unreadable: ")
    assert not any(line.startswith("cpu-node ") for line in lines)


def test_nodes_warns_of_overcommitted_ledgers() -> None:
    """A ledger that grants one GPU twice is shown as a warning with the builder's numbers."""
    reader = FakeReader()
    held = allocation((GpuGrant(0, UUIDS[0], True),), node=TYPO)
    twice = Ledger(TYPO, tuple(LedgerEntry(f"u{i}", "ml", f"p{i}", held, float(i)) for i in (1, 2)))
    reader.ledger_objects[TYPO] = ledger_object(twice)
    text = run_cli("nodes", reader=reader)[1]
    assert "ledger overcommits a GPU" in " ".join(row_of(text, TYPO))
    assert (
        "warning: node gpu-typo: ledger overcommits: GPU 0 held whole 2x and shared=False"
        in text.splitlines()
    )


def test_nodes_without_node_objects_still_lists_the_gpus() -> None:
    """When Nodes cannot be read the table is still printed, with a warning that cordons are not shown."""
    reader = FakeReader(nodes_error="listing Nodes: HTTP 403 forbidden")
    text = run_cli("nodes", reader=reader)[1]
    assert _counts(row_of(text, DRAINED))["cordoned"] == 0
    assert "no Node object" not in text
    assert text.splitlines()[-1] == (
        "warning: listing Nodes: HTTP 403 forbidden; cordoned GPUs and unschedulable nodes are not shown"
    )


def test_nodes_of_an_empty_cluster_says_where_to_look() -> None:
    """No GpuTopology and no ledger: one line pointing at the node agent, and Nodes are not even listed."""
    reader = FakeReader()
    reader.topology_objects.clear()
    reader.ledger_objects.clear()
    assert run_cli("nodes", reader=reader) == (
        0,
        "No GpuTopology objects found: is the node agent running?\n",
    )
    assert ("nodes",) not in reader.asked


# ----------------------------------------------------------------------------- topo


def test_topo_prints_the_matrix_with_kinds_bandwidth_and_legend() -> None:
    """The link matrix has NV12 300 between A100s, PXB to the near NICs, NUMA and affinity columns."""
    code, text = run_cli("topo", NODE)
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == f"Node {NODE}: 8 x A100-SXM4-40GB, NVSwitch (NV12 per GPU)"
    header = lines[1].split()
    assert header[:2] == ["GPU0", "GPU1"] and "NIC9" in header and header[-2:] == ["CPU", "Affinity"]
    gpu0 = lines[2].split()
    assert gpu0[:4] == ["GPU0", "X", "NV12", "300"]
    assert "PXB" in gpu0 and gpu0[-2:] == ["3", "48-63,176-191"]
    assert any(line.startswith("NIC0 ") for line in lines)
    assert "  NV#   = NVLink with # links, directly or through NVSwitch" in lines
    assert "  NIC0: mlx5_0" in lines


def test_topo_lists_each_gpus_state_as_the_nodes_table_counts_it() -> None:
    """Every GPU gets its word (whole, shared with amounts, unhealthy with the reason, cordoned, free)."""
    reader = FakeReader()
    lines = run_cli("topo", NODE, reader=reader)[1].splitlines()
    gpus = lines[lines.index("GPUs:") + 1 :]
    assert gpus == [
        "  GPU0: whole",
        "  GPU1: whole",
        "  GPU2: shared (10240 of 40960 MiB, 25 of 100 units)",
        f"  GPU3: unhealthy ({XID})",
        "  GPU4: whole",
        "  GPU5: cordoned",
        "  GPU6: free",
        "  GPU7: free",
    ]
    assert ("node", NODE) in reader.asked and ("ledger", NODE) in reader.asked


def test_topo_of_an_unschedulable_node_shows_every_gpu_cordoned() -> None:
    """Held and free GPUs alike show as cordoned on an unschedulable Node, with a note saying why."""
    lines = run_cli("topo", DRAINED)[1].splitlines()
    assert "  GPU0: unhealthy, cordoned (XID 48: double-bit ECC error)" in lines
    assert "  GPU1: cordoned; still held: whole" in lines and "  GPU7: cordoned" in lines
    assert lines[-1] == "Node is unschedulable (kubectl cordon): no GPU of it takes new pods."


def test_topo_shows_cordon_problems_and_unreadable_parts_as_warnings() -> None:
    """Bad cordon entries, an unreadable Node and an unreadable ledger are warnings under the matrix."""
    text = run_cli("topo", TYPO)[1]
    assert "  GPU7: cordoned" in text.splitlines()
    assert "warning: linkpack.io/cordoned-gpus: entry 2 'MIG-" in text
    reader = FakeReader(
        nodes_error="reading Node gpu-a: HTTP 403 forbidden", ledger_error="reading ledger: boom"
    )
    lines = run_cli("topo", NODE, reader=reader)[1].splitlines()
    assert "  GPU5: free" in lines and "  GPU0: free" in lines
    assert lines[-2] == "warning: ledger ConfigMap linkpack-ledger-gpu-a is unreadable: reading ledger: boom"
    assert lines[-1] == "warning: reading Node gpu-a: HTTP 403 forbidden; cordoned GPUs are not shown"
    assert "No Node object named gpu-lost: cordons cannot be read." in run_cli("topo", LOST)[1]


def test_topo_of_an_unknown_or_malformed_node_is_an_error() -> None:
    """No such GpuTopology, or one the codec rejects, is a PluginError with the reason."""
    with pytest.raises(PluginError, match="no GpuTopology named 'nope'"):
        run_cli("topo", "nope")
    with pytest.raises(PluginError, match="GpuTopology gpu-bad: spec: schemaVersion"):
        run_cli("topo", BAD)


# ----------------------------------------------------------------------------- pods


def test_pods_lists_holders_and_flags_disagreements() -> None:
    """Each ledger entry is checked against its pod; pods with only an annotation are listed too."""
    code, text = run_cli("pods")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "NODE", "GPUS", "SHARE", "ENFORCEMENT", "STATE"]
    rows = {line.split()[1]: line for line in lines[1:] if not line.startswith("warning")}
    assert rows["train"].split()[2:7] == [NODE, "0,1", "whole", "none", "bound"]
    assert rows["infer"].split()[3:6] == ["2", "10240Mi/25u", "cooperative"]
    assert rows["infer"].endswith("reserved, not bound yet")
    assert rows["gone"].endswith("pod not found (stale; the extender releases it)")
    assert rows["stray"].endswith("annotation only: not in the ledger")
    assert rows["job"].split()[:3] == ["batch", "job", DRAINED] and rows["job"].endswith("bound")
    assert "bad annotation: allocation: not JSON" in rows["broken"]
    assert "cpu-only" not in rows
    assert lines[-1].startswith("warning: ledger ConfigMap linkpack-ledger-gpu-broken is unreadable")


def test_pods_of_one_namespace_and_finished_or_moved_pods() -> None:
    """-n filters ledger entries and pods; finished and elsewhere-bound pods are told apart."""
    reader = FakeReader()
    reader.pod_objects[0]["status"]["phase"] = "Succeeded"
    reader.pod_objects[1]["spec"]["nodeName"] = "gpu-other"
    text = run_cli("pods", "-n", "ml", reader=reader)[1]
    assert row_of(text, "ml")[0] == "ml" and "batch" not in text
    assert text.splitlines()[1].endswith("finished (Succeeded)")
    assert "bound to another node (gpu-other)" in text
    assert run_cli("pods", "-n", "other")[1].startswith("No GPU allocations found.")


def test_pods_names_mig_slices_by_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MIG grant shows the profile of the configured MIG resource ($LINKPACK_RESOURCE_MIG_PREFIX)."""
    monkeypatch.setenv("LINKPACK_RESOURCE_MIG_PREFIX", "example.com/mig-")
    reader = FakeReader()
    grant = GpuGrant(7, UUIDS[7], False, 0, 0, "MIG-4f1b0d5e-0000-5000-8000-000000000001")
    mig = Allocation(TYPO, (grant,), 1, Enforcement.MIG, (("example.com/mig-1g.10gb", 1),))
    reader.ledger_objects[TYPO] = ledger_object(
        Ledger(TYPO, (LedgerEntry("uid-mig", "ml", "mig", mig, 5.0),))
    )
    text = run_cli("pods", reader=reader)[1]
    row = next(line.split() for line in text.splitlines() if line.split()[1:2] == ["mig"])
    assert row[2:7] == [TYPO, "7", "MIG", "1g.10gb", "mig"]
