"""`kubectl linkpack` on canned API objects: translation, formatting and the command flow."""

from __future__ import annotations

import datetime as dt
import io
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from extender import kubectl_plugin as plugin
from extender.app import create_app
from extender.debug_routes import register_debug_routes
from extender.ledger import LEDGER_LABEL, Ledger, LedgerEntry, encode_ledger, ledger_name
from extender.memory_api import InMemoryCluster
from extender.service import ExtenderService
from topology.allocation import ALLOCATION_ANNOTATION, Allocation, Enforcement, encode_allocation
from topology.catalog import load_machine
from topology.codec import encode_topology
from topology.workload import GpuGrant

from .browser import serve
from .conftest import filter_args, gpu_pod

NODE = "gpu-a"
NOW = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
TOPOLOGY = load_machine("dgx-a100")


def topology_object(name: str = NODE, heartbeat: str = "2025-03-01T11:59:20Z") -> dict[str, Any]:
    gpus = TOPOLOGY.gpus
    return {
        "apiVersion": "linkpack.io/v1alpha1",
        "kind": "GpuTopology",
        "metadata": {"name": name},
        "spec": encode_topology(TOPOLOGY),
        "status": {
            "heartbeat": heartbeat,
            "gpuHealth": [
                {"index": g.index, "uuid": g.uuid, "healthy": g.index != 3,
                 "reason": "XID 79: fallen off the bus" if g.index == 3 else "", "cordoned": g.index == 5}
                for g in gpus
            ],
        },
    }  # fmt: skip


def _allocation(grants: tuple[GpuGrant, ...], enforcement: Enforcement = Enforcement.NONE) -> Allocation:
    return Allocation(NODE, grants, 1, enforcement, (("nvidia.com/gpu", len(grants)),))


WHOLE = _allocation(tuple(GpuGrant(i, TOPOLOGY.gpus[i].uuid, True) for i in (0, 1)))
SHARE = _allocation((GpuGrant(2, TOPOLOGY.gpus[2].uuid, False, 10240, 25),), Enforcement.COOPERATIVE)
LEDGER = Ledger(
    NODE,
    (
        LedgerEntry("uid-train", "ml", "train", WHOLE, 1000.0),
        LedgerEntry("uid-infer", "ml", "infer", SHARE, 1001.0),
        LedgerEntry(
            "uid-gone", "ml", "gone", _allocation((GpuGrant(4, TOPOLOGY.gpus[4].uuid, True),)), 1002.0
        ),
    ),
    "41",
)


def ledger_object(ledger: Ledger = LEDGER) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ledger_name(ledger.node), "namespace": "linkpack-system",
                     "labels": {LEDGER_LABEL: "true"}, "resourceVersion": ledger.resource_version},
        "data": encode_ledger(ledger),
    }  # fmt: skip


def pod_object(
    name: str, uid: str, node: str, annotation: str | None, phase: str = "Running"
) -> dict[str, Any]:
    annotations = {ALLOCATION_ANNOTATION: annotation} if annotation is not None else {}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


PODS = [
    pod_object("train", "uid-train", NODE, encode_allocation(WHOLE)),
    pod_object("infer", "uid-infer", "", encode_allocation(SHARE), "Pending"),
    pod_object("stray", "uid-stray", NODE, encode_allocation(_allocation((GpuGrant(6, "GPU-x", True),)))),
    pod_object("broken", "uid-broken", NODE, "{not json"),
    pod_object("cpu-only", "uid-cpu", NODE, None),
]


class FakeSource:
    def __init__(self, explain: Any = None) -> None:
        self._explain = explain
        self.asked: list[tuple[str, str]] = []

    def topologies(self) -> list[dict[str, Any]]:
        bad = topology_object("gpu-bad")
        bad["spec"]["schemaVersion"] = "v0"
        return [topology_object(), bad]

    def topology(self, name: str) -> dict[str, Any] | None:
        return topology_object(name) if name == NODE else None

    def ledgers(self) -> list[dict[str, Any]]:
        orphan = ledger_object(Ledger("gpu-gone", (), "7"))
        broken = ledger_object(Ledger("gpu-broken", (), "8"))
        broken["data"] = {"ledger": "[]"}
        return [ledger_object(), orphan, broken]

    def pods(self, namespace: str | None) -> list[dict[str, Any]]:
        return [p for p in PODS if namespace in (None, p["metadata"]["namespace"])]

    def explain(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        self.asked.append((namespace, name))
        reply = self._explain(namespace, name)
        return reply.status_code, reply.json()

    def default_namespace(self) -> str:
        return "ml"


def run(*argv: str, source: Any = None) -> tuple[int, str]:
    out = io.StringIO()
    code = plugin.run(plugin.parser().parse_args(list(argv)), source or FakeSource(), out, NOW)
    return code, out.getvalue()


# ----------------------------------------------------------------------------- translation


def test_a_gpu_topology_object_becomes_a_record() -> None:
    record = plugin.node_record(topology_object())
    assert record.topology == replace(TOPOLOGY, warnings=TOPOLOGY.warnings)
    assert record.unhealthy == {3} and record.cordoned == {5}
    assert record.heartbeat == dt.datetime(2025, 3, 1, 11, 59, 20, tzinfo=dt.UTC)
    bad = topology_object()
    bad["spec"]["gpus"][0]["index"] = "zero"
    broken = plugin.node_record(bad)
    assert broken.topology is None and broken.error.startswith("malformed spec:")


def test_ledgers_and_pod_annotations_are_read() -> None:
    ledgers, errors = plugin.ledgers_from(FakeSource().ledgers())
    assert ledgers[NODE] == LEDGER and ledgers["gpu-gone"].entries == ()
    assert set(errors) == {"linkpack-ledger-gpu-broken"}
    pods = {p.name: p for p in plugin.pod_allocations(PODS)}
    assert set(pods) == {"train", "infer", "stray", "broken"}
    assert pods["train"].allocation == WHOLE and pods["infer"].node_name == ""
    assert pods["broken"].allocation is None and "not JSON" in pods["broken"].error


# ----------------------------------------------------------------------------- nodes / topo / pods


def test_nodes_shows_counts_memory_heartbeat_and_health() -> None:
    code, text = run("nodes")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split() == [
        "NODE", "MODEL", "GPUS", "FREE", "SHARED", "WHOLE", "UNHEALTHY", "CORDONED",
        "FREE-MEM", "PODS", "HEARTBEAT", "HEALTH",
    ]  # fmt: skip
    row = next(line for line in lines if line.startswith(NODE + " "))
    free_mib = 2 * 40960 + (40960 - 10240)  # GPUs 6, 7 and what the share leaves on GPU 2
    # GPU 4 is held by the stale entry "gone": the ledger is what the extender counts
    assert row.split()[:11] == [
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
    assert row.endswith("GPU3: XID 79: fallen off the bus")
    assert any(line.startswith("gpu-bad ") and "malformed spec" in line for line in lines)
    assert any(line.startswith("gpu-gone ") and "no GpuTopology (ledger only)" in line for line in lines)
    assert lines[-1].startswith("warning: ledger linkpack-ledger-gpu-broken is unreadable")


def test_topo_prints_the_matrix_with_kinds_bandwidth_and_legend() -> None:
    code, text = run("topo", NODE)
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
    assert "  GPU3: unhealthy (XID 79: fallen off the bus)" in lines and "  GPU5: healthy, cordoned" in lines


def test_topo_of_an_unknown_node_is_an_error() -> None:
    with pytest.raises(plugin.PluginError, match="no GpuTopology named 'nope'"):
        run("topo", "nope")


def test_pods_lists_holders_and_flags_disagreements() -> None:
    code, text = run("pods")
    assert code == 0
    rows = {line.split()[1]: line for line in text.splitlines()[1:]}
    assert text.splitlines()[0].split() == [
        "NAMESPACE",
        "NAME",
        "NODE",
        "GPUS",
        "SHARE",
        "ENFORCEMENT",
        "STATE",
    ]
    assert rows["train"].split()[2:7] == [NODE, "0,1", "whole", "none", "bound"]
    assert rows["infer"].split()[3:6] == ["2", "10240Mi/25u", "cooperative"]
    assert rows["infer"].endswith("reserved, not bound yet")
    assert rows["gone"].endswith("pod not found (stale; the extender releases it)")
    assert rows["stray"].endswith("annotation only: not in the ledger")
    assert "bad annotation: allocation: not JSON" in rows["broken"]
    assert "cpu-only" not in rows
    assert run("pods", "-n", "other")[1].startswith("No GPU allocations found.")


# ----------------------------------------------------------------------------- explain


@pytest.fixture
def debug_http(service: ExtenderService) -> TestClient:
    app = create_app(service)
    register_debug_routes(app, service)
    return TestClient(app)


def _bind(service: ExtenderService, cluster: InMemoryCluster, pod: dict[str, Any], node: str) -> None:
    created = cluster.create_pod(pod)
    service.filter(filter_args(created, ["nv-node", "pcie-node", "bare-node"]))
    service.prioritize(filter_args(created, ["nv-node", "pcie-node"]))
    meta = created["metadata"]
    service.bind({"PodName": meta["name"], "PodNamespace": "ml", "PodUID": meta["uid"], "Node": node})


def test_explain_formats_the_extenders_answer(
    debug_http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    _bind(service, cluster, gpu_pod("trainer", gpus=2), "nv-node")
    source = FakeSource(lambda ns, name: debug_http.get(f"/debug/explain/{ns}/{name}"))
    code, text = run("explain", "trainer", source=source)
    assert code == 0 and source.asked == [("ml", "trainer")]
    lines = text.splitlines()
    assert lines[0] == "Pod ml/trainer: bound"
    assert lines[1].startswith("  bound to nv-node on GPUs [")
    assert lines[2] == "Request: 2 whole GPU(s); policy balanced (link 1, fragmentation 1, packing 1)"
    assert any(
        line.startswith("Allocation: nv-node GPUs [") and "whole, enforcement none" in line for line in lines
    )
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["NODE", "FILTER", "SCORE", "LINK", "FRAG", "PACK", "GPUS", "REASON"]
    nv = next(row.split() for row in table if row.startswith("nv-node "))
    assert nv[1] == "passed" and nv[2].isdigit() and 0 <= int(nv[2]) <= 10
    assert table[-1].split()[:2] == ["bare-node", "unresolvable"] and table[-1].endswith(
        "node has no GPU topology record"
    )
    code, raw = run("explain", "-n", "ml", "trainer", "-o", "json", source=source)
    assert code == 0 and '"status": "bound"' in raw


def test_explain_of_an_unseen_pod_fails_with_the_extenders_message(debug_http: TestClient) -> None:
    source = FakeSource(lambda ns, name: debug_http.get(f"/debug/explain/{ns}/{name}"))
    code, text = run("explain", "other/ghost", source=source)
    assert code == 1 and source.asked == [("other", "ghost")]
    assert (
        text.strip()
        == "error: the extender has not been asked about pod other/ghost yet; no such pod in the cluster"
    )


def test_pod_names_and_namespaces() -> None:
    assert plugin.split_pod("ns/pod", None, lambda: "x") == ("ns", "pod")
    assert plugin.split_pod("pod", "ns", lambda: "x") == ("ns", "pod")
    assert plugin.split_pod("pod", None, lambda: "ctx-ns") == ("ctx-ns", "pod")
    with pytest.raises(plugin.PluginError, match="names namespace 'a' but -n says 'b'"):
        plugin.split_pod("a/pod", "b", lambda: "x")


def test_main_asks_an_extender_url_over_http(
    service: ExtenderService, cluster: InMemoryCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _bind(service, cluster, gpu_pod("trainer", gpus=1), "pcie-node")
    app = create_app(service)
    register_debug_routes(app, service)
    with serve(app) as base:
        assert plugin.main(["explain", "ml/trainer", "--extender-url", base + "/"]) == 0
        assert capsys.readouterr().out.startswith("Pod ml/trainer: bound\n  bound to pcie-node on GPUs [")
        assert plugin.main(["explain", "ml/nobody", "--extender-url", base]) == 1
        assert "has not been asked about pod ml/nobody yet" in capsys.readouterr().out


def test_credentials_come_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert plugin.kubeconfig_path(None) is None
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert plugin.kubeconfig_path(None) == str(tmp_path / ".kube" / "config")
    monkeypatch.setenv("KUBECONFIG", "/a:/b")
    assert plugin.kubeconfig_path(None) == "/a:/b"
    assert plugin.kubeconfig_path("/explicit") == "/explicit"


def test_an_unreadable_kubeconfig_is_a_clean_error(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    missing.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    assert plugin.main(["--kubeconfig", str(missing), "nodes"]) == 1
    assert capsys.readouterr().err.startswith("error: cannot load Kubernetes credentials:")
