"""Canned API objects, written the way the node agent and the extender write them, and a fake
`ClusterReader` that serves them."""

from __future__ import annotations

import copy
import datetime as dt
import io
from collections.abc import Callable
from typing import Any

from contract.allocation import Allocation, Enforcement, encode_allocation
from contract.gpu_topology import GpuHealthEntry, TopologyStatus, encode_status, topology_object
from contract.keys import (
    ALLOCATION_ANNOTATION,
    DEFAULT_NAMESPACE,
    LEDGER_LABEL,
    ledger_name,
)
from contract.ledger import Ledger, LedgerEntry, encode_ledger
from kubectl_linkpack import cli
from kubectl_linkpack.cluster_reader import ClusterReader, ExtenderReply
from kubectl_linkpack.errors import PluginError
from tests.support.machines import dgx_a100
from tests.support.nodes import node_object
from tests.support.pods import pod_manifest
from tests.support.resources import GPU, SHARED
from topology.model import NodeTopology
from topology.scheduling import GpuGrant

NOW = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
TOPOLOGY = dgx_a100()
UUIDS = [g.uuid for g in TOPOLOGY.gpus]
XID = "XID 79: fallen off the bus"

NODE = "gpu-a"  # GPU 3 unhealthy, GPU 5 cordoned by an upper-case UUID, three ledger entries
BAD = "gpu-bad"  # its GpuTopology spec has an unknown schema
DRAINED = "gpu-drained"  # spec.unschedulable: every GPU out of new placements; GPU 0 unhealthy
TYPO = "gpu-typo"  # its cordon annotation has a MIG UUID and a UUID of no GPU of the node
LOST = "gpu-lost"  # a GpuTopology without a Node object
GONE = "gpu-gone"  # a ledger without a GpuTopology
BROKEN = "gpu-broken"  # a ledger that is not a ledger
STRANGER = "GPU-00000000-1111-2222-3333-444444444444"


def gpu_topology(
    name: str,
    topology: NodeTopology = TOPOLOGY,
    unhealthy: dict[int, str] | None = None,
    heartbeat: str = "2025-03-01T11:59:20Z",
) -> dict[str, Any]:
    """A GpuTopology object with its status, as the node agent publishes it."""
    bad = unhealthy or {}
    health = tuple(
        GpuHealthEntry(g.index, g.uuid, g.index not in bad, bad.get(g.index, "")) for g in topology.gpus
    )
    status = TopologyStatus(health, topology.gpu_count, "test", heartbeat=heartbeat)
    return {**topology_object(name, topology), "status": encode_status(status)}


def allocation(
    grants: tuple[GpuGrant, ...], enforcement: Enforcement = Enforcement.NONE, node: str = NODE
) -> Allocation:
    whole = sum(1 for g in grants if g.whole)
    resources = ((GPU, whole),) if whole else ((SHARED, grants[0].units),)
    return Allocation(node, grants, 1, enforcement, resources)


def whole(*indices: int) -> tuple[GpuGrant, ...]:
    return tuple(GpuGrant(i, UUIDS[i], True) for i in indices)


WHOLE = allocation(whole(0, 1))
SHARE = allocation((GpuGrant(2, UUIDS[2], False, 10240, 25),), Enforcement.COOPERATIVE)
LEDGER = Ledger(
    NODE,
    (
        LedgerEntry("uid-train", "ml", "train", WHOLE, 1000.0),
        LedgerEntry("uid-infer", "ml", "infer", SHARE, 1001.0),
        LedgerEntry("uid-gone", "ml", "gone", allocation(whole(4)), 1002.0),
    ),
    "41",
)
DRAINED_LEDGER = Ledger(
    DRAINED, (LedgerEntry("uid-job", "batch", "job", allocation(whole(1), node=DRAINED), 900.0),), "12"
)


def ledger_object(ledger: Ledger) -> dict[str, Any]:
    """A ledger ConfigMap as the extender writes it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ledger_name(ledger.node), "namespace": DEFAULT_NAMESPACE,
                     "labels": {LEDGER_LABEL: "true"}, "resourceVersion": ledger.resource_version},
        "data": encode_ledger(ledger),
    }  # fmt: skip


def pod_object(
    name: str, uid: str, node: str, annotation: str | None, phase: str = "Running", namespace: str = "ml"
) -> dict[str, Any]:
    """A pod on `node` ("" pending) with the allocation annotation's text (None: none)."""
    annotations = {ALLOCATION_ANNOTATION: annotation} if annotation is not None else {}
    return pod_manifest(
        name, namespace=namespace, uid=uid, annotations=annotations, node=node or None, phase=phase
    )


def default_topologies() -> dict[str, dict[str, Any]]:
    bad = gpu_topology(BAD)
    bad["spec"]["schemaVersion"] = "v0"
    return {
        NODE: gpu_topology(NODE, unhealthy={3: XID}),
        BAD: bad,
        DRAINED: gpu_topology(DRAINED, unhealthy={0: "XID 48: double-bit ECC error"}),
        TYPO: gpu_topology(TYPO),
        LOST: gpu_topology(LOST, heartbeat=""),
    }


def default_nodes() -> dict[str, dict[str, Any]]:
    return {
        NODE: node_object(NODE, cordons=UUIDS[5].upper()),
        BAD: node_object(BAD),
        DRAINED: node_object(DRAINED, unschedulable=True),
        TYPO: node_object(TYPO, cordons=f"{UUIDS[7]}, MIG-4f1b0d5e-0000-5000-8000-000000000000,{STRANGER}"),
        "cpu-node": node_object("cpu-node"),
    }


def default_ledgers() -> dict[str, dict[str, Any]]:
    broken = ledger_object(Ledger(BROKEN, (), "8"))
    broken["data"] = {"ledger": "[]"}
    return {
        NODE: ledger_object(LEDGER),
        DRAINED: ledger_object(DRAINED_LEDGER),
        GONE: ledger_object(Ledger(GONE, (), "7")),
        BROKEN: broken,
    }


def default_pods() -> list[dict[str, Any]]:
    stray = allocation((GpuGrant(6, UUIDS[6], True),))
    return [
        pod_object("train", "uid-train", NODE, encode_allocation(WHOLE)),
        pod_object("infer", "uid-infer", "", encode_allocation(SHARE), "Pending"),
        pod_object("stray", "uid-stray", NODE, encode_allocation(stray)),
        pod_object("broken", "uid-broken", NODE, "{not json"),
        pod_object("cpu-only", "uid-cpu", NODE, None),
        pod_object("job", "uid-job", DRAINED, encode_allocation(DRAINED_LEDGER.entries[0].allocation),
                   namespace="batch"),
    ]  # fmt: skip


Explainer = Callable[[str, str], ExtenderReply]


def _no_extender(namespace: str, name: str) -> ExtenderReply:
    raise PluginError("no extender in this test")


class FakeReader:
    """A `ClusterReader` over dictionaries of API objects; records what it was asked."""

    def __init__(
        self, explain: Explainer = _no_extender, nodes_error: str = "", ledger_error: str = ""
    ) -> None:
        self.topology_objects = default_topologies()
        self.node_objects = default_nodes()
        self.ledger_objects = default_ledgers()
        self.pod_objects = default_pods()
        self.policy_objects: dict[str, dict[str, Any]] = {}
        self.namespace_objects: dict[str, dict[str, Any]] = {}
        self._explain = explain
        self._nodes_error = nodes_error
        self._ledger_error = ledger_error
        self.asked: list[tuple[str, ...]] = []

    policy_objects: dict[str, dict[str, Any]] = {}
    namespace_objects: dict[str, dict[str, Any]] = {}

    def policies(self) -> list[dict[str, Any]]:
        self.asked.append(("policies",))
        return copy.deepcopy(list(self.policy_objects.values()))

    def namespaces(self) -> list[dict[str, Any]]:
        self.asked.append(("namespaces",))
        return copy.deepcopy(list(self.namespace_objects.values()))

    def topologies(self) -> list[dict[str, Any]]:
        self.asked.append(("topologies",))
        return copy.deepcopy(list(self.topology_objects.values()))

    def topology(self, name: str) -> dict[str, Any] | None:
        self.asked.append(("topology", name))
        return copy.deepcopy(self.topology_objects.get(name))

    def nodes(self) -> list[dict[str, Any]]:
        self.asked.append(("nodes",))
        if self._nodes_error:
            raise PluginError(self._nodes_error)
        return copy.deepcopy(list(self.node_objects.values()))

    def node(self, name: str) -> dict[str, Any] | None:
        self.asked.append(("node", name))
        if self._nodes_error:
            raise PluginError(self._nodes_error)
        return copy.deepcopy(self.node_objects.get(name))

    def ledgers(self) -> list[dict[str, Any]]:
        self.asked.append(("ledgers",))
        return copy.deepcopy(list(self.ledger_objects.values()))

    def ledger(self, node: str) -> dict[str, Any] | None:
        self.asked.append(("ledger", node))
        if self._ledger_error:
            raise PluginError(self._ledger_error)
        return copy.deepcopy(self.ledger_objects.get(node))

    def pods(self, namespace: str | None) -> list[dict[str, Any]]:
        self.asked.append(("pods", str(namespace)))
        return [copy.deepcopy(p) for p in self.pod_objects if namespace in (None, p["metadata"]["namespace"])]

    def explain(self, namespace: str, name: str) -> ExtenderReply:
        self.asked.append(("explain", namespace, name))
        return self._explain(namespace, name)

    def default_namespace(self) -> str:
        return "ml"


def run_cli(*argv: str, reader: ClusterReader | None = None) -> tuple[int, str]:
    """Parse `argv` and run it against `reader` (a fresh `FakeReader` by default) at `NOW`."""
    out = io.StringIO()
    code = cli.run(cli.parser().parse_args(list(argv)), reader or FakeReader(), out, NOW)
    return code, out.getvalue()


def row_of(text: str, first: str) -> list[str]:
    """The whitespace-split line of a table that starts with `first`."""
    return next(line.split() for line in text.splitlines() if line.startswith(first + " "))
