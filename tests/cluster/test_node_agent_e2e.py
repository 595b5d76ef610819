"""The node agent as its own process against a real kube-apiserver, on a simulated DGX A100.

- publishing: the GpuTopology named after the node, its spec (8 GPUs, NV12 between every pair),
  its status (GPU count, MPS, health), a heartbeat that moves while the spec stays put, a fault
  injected through the agent's /debug/inject and a cordon set through the node annotation (in
  upper case, with a junk entry beside it), all reflected in the status;
- the device plugin: a fake kubelet in this process, a real pod bound to the node carrying an
  allocation record; the kubelet's Allocate is answered from the record and the consumed
  annotation lands on the pod through the API;
- KubePodRecords itself against the API server's resourceVersion preconditions (real 409s).

Every wait is on a condition seen through the API, never a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid as uuidlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.allocation import Allocation, Consumption, decode_consumption, encode_allocation
from contract.keys import (
    ALLOCATION_ANNOTATION,
    CONSUMED_ANNOTATION,
    CORDON_ANNOTATION,
    GROUP,
    TOPOLOGY_HASH_ANNOTATION,
    TOPOLOGY_PLURAL,
    TOPOLOGY_VERSION,
)
from contract.pod_demand import ContainerRole
from node_agent.deviceplugin._generated import deviceplugin_pb2 as api  # the kubelet's messages
from node_agent.deviceplugin.pod_records import KubePodRecords
from node_agent.kube.client import KubernetesNodeApi
from tests.cluster.controlplane import REPO_ROOT, ControlPlane, bind_pod, delete_fake_node, free_port
from tests.cluster.linkpack_env import wait_until
from tests.cluster.procs import die_with_parent
from tests.node_agent.fake_kubelet import FakeKubelet, plugin_stub
from tests.support.pods import api_pod_manifest
from tests.support.resources import GPU
from topology.codec import decode_topology
from topology.model import LinkKind
from topology.scheduling import GpuGrant

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

VERSION, PLURAL = TOPOLOGY_VERSION, TOPOLOGY_PLURAL
#: How long a change may take to show in the API under load (the agent polls every 0.5 s).
SETTLE_S = 20


@dataclass
class AgentProcess:
    node: str
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def inject(self, command: dict[str, Any]) -> None:
        answer = httpx.post(f"{self.url}/debug/inject", content=json.dumps(command), timeout=5)
        assert answer.status_code == 200, answer.text

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise
        return int(self.proc.returncode)


@contextlib.contextmanager
def running_agent(
    cp: ControlPlane, node: str, extra: Sequence[str], machine: str = "dgx-a100"
) -> Iterator[AgentProcess]:
    """`python -m node_agent --simulate <machine>` for `node`, until its /healthz answers."""
    port = free_port()
    log_path = cp.log_dir / f"node-agent-{node}.log"
    argv = [
        sys.executable,
        "-m",
        "node_agent",
        f"--simulate={machine}",
        f"--node-name={node}",
        f"--kubeconfig={cp.kubeconfig_path}",
        "--metrics-host=127.0.0.1",
        f"--metrics-port={port}",
        "--poll-interval=0.5",
        "--heartbeat-interval=1",
        *extra,
    ]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=die_with_parent(),  # only set on the main thread
        )
    agent = AgentProcess(node, port, log_path, proc)
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"node agent exited with {proc.returncode}:\n{agent.log()}")
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"{agent.url}/healthz", timeout=2).status_code == 200
            return False

        wait_until(healthy, 30, "the node agent's /healthz")
        yield agent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def gpu_node(linkpack_crd: ControlPlane) -> Iterator[str]:
    """A fake node (no kubelet) for one agent; its node object and GpuTopology are deleted after."""
    name = f"agent-e2e-{uuidlib.uuid4().hex[:6]}"
    linkpack_crd.create_fake_node(name, {GPU: "8"}, labels={"nvidia.com/gpu.present": "true"})
    yield name
    with contextlib.suppress(ApiException):
        _custom(linkpack_crd).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    delete_fake_node(linkpack_crd.api_client(), name)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A kubelet device-plugin directory under /tmp (unix socket paths must stay short)."""
    path = Path(tempfile.mkdtemp(prefix="lp-e2e-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# The client's models type every field Optional; these tests read them as the server filled them.
def _custom(cp: ControlPlane) -> Any:
    return client.CustomObjectsApi(cp.api_client())


def _core(cp: ControlPlane) -> Any:
    return client.CoreV1Api(cp.api_client())


def _record(cp: ControlPlane, node: str) -> dict[str, Any] | None:
    try:
        return dict(_custom(cp).get_cluster_custom_object(GROUP, VERSION, PLURAL, node))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _published(cp: ControlPlane, node: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def present() -> bool:
        record = _record(cp, node)
        if record and (record.get("status") or {}).get("gpuHealth"):
            found.update(record)
            return True
        return False

    wait_until(present, 20, f"GpuTopology {node} with a status")
    return found


def _status(cp: ControlPlane, node: str) -> dict[str, Any]:
    return dict((_record(cp, node) or {}).get("status") or {})


def _health_entry(cp: ControlPlane, node: str, index: int) -> dict[str, Any]:
    entries = _status(cp, node).get("gpuHealth") or []
    return next((e for e in entries if e.get("index") == index), {})


def _later_heartbeat(cp: ControlPlane, node: str, what: str) -> None:
    """Wait for a heartbeat written after now: at least one more poll has run and been published."""
    beat = _status(cp, node).get("heartbeat")
    wait_until(lambda: _status(cp, node).get("heartbeat") not in (None, beat), SETTLE_S, what)


# ---------------------------------------------------------------------- publishing


def test_agent_publishes_heartbeats_and_reports_faults_and_cordons(
    linkpack_crd: ControlPlane, gpu_node: str
) -> None:
    """The agent publishes its GpuTopology and heartbeats, and reports an XID 79 and a cordon in its status."""
    cp, node = linkpack_crd, gpu_node
    with running_agent(cp, node, ["--no-device-plugin"]) as agent:
        record = _published(cp, node)
        topology = decode_topology(record["spec"])
        assert record["metadata"]["name"] == node and topology.gpu_count == 8
        pairs = [topology.link(a, b) for a in range(8) for b in range(a + 1, 8)]
        assert all(link.kind is LinkKind.NV and link.nvlinks == 12 for link in pairs)
        status = record["status"]
        assert status["heartbeat"] and status["agentVersion"]
        assert status["gpuCount"] == 8  # the CRD's printer column
        assert status["mps"] == {"active": False} and status["interposer"] == {"available": False}
        assert status["cordonProblems"] == []
        assert [e["healthy"] for e in status["gpuHealth"]] == [True] * 8
        assert [e["uuid"] for e in status["gpuHealth"]] == [g.uuid for g in topology.gpus]
        spec_hash = record["metadata"]["annotations"][TOPOLOGY_HASH_ANNOTATION]
        generation = record["metadata"]["generation"]

        # The heartbeat moves on; the unchanged spec is not written again.
        _later_heartbeat(cp, node, "a later heartbeat")
        later = _record(cp, node) or {}
        assert later["metadata"]["generation"] == generation
        assert later["metadata"]["annotations"][TOPOLOGY_HASH_ANNOTATION] == spec_hash
        assert later["spec"] == record["spec"]

        # XID 79 (fallen off the bus) on GPU 3: unhealthy in the status, with the XID as the reason.
        # The GPU stops answering NVML too; whichever the agent notices first, the XID must win,
        # and stay the reason on the polls that follow (each sees the GPU unreadable again).
        agent.inject({"gpu": 3, "xid": 79})
        wait_until(
            lambda: "XID 79" in str(_health_entry(cp, node, 3).get("reason")),
            SETTLE_S,
            "GPU 3 down by XID 79",
        )
        _later_heartbeat(cp, node, "a heartbeat after GPU 3 went down")
        entry = _health_entry(cp, node, 3)
        assert entry["healthy"] is False and entry["severity"] == "fatal", entry
        assert entry["reason"].startswith("XID 79"), entry
        assert all(_health_entry(cp, node, i)["healthy"] for i in range(8) if i != 3)

        # Cordon GPU 5 through the node annotation, its UUID in upper case and junk beside it,
        # then lift it.
        gpu5 = topology.gpus[5].uuid
        core = _core(cp)
        cordon = f"GPU-{gpu5[4:].upper()},not-a-gpu"
        core.patch_node(node, {"metadata": {"annotations": {CORDON_ANNOTATION: cordon}}})
        wait_until(lambda: _health_entry(cp, node, 5).get("cordoned") is True, SETTLE_S, "GPU 5 cordoned")
        assert _health_entry(cp, node, 5)["healthy"] is True
        problems = _status(cp, node).get("cordonProblems")
        assert problems and len(problems) == 1 and "'not-a-gpu' is not a GPU UUID" in problems[0], problems
        core.patch_node(node, {"metadata": {"annotations": {CORDON_ANNOTATION: None}}})
        wait_until(lambda: _health_entry(cp, node, 5).get("cordoned") is False, SETTLE_S, "GPU 5 uncordoned")
        assert _status(cp, node).get("cordonProblems") == []

        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
        reasons = {e.reason for e in events}
        assert {"GpuUnhealthy", "GpuCordonChanged", "BadCordonAnnotation"} <= reasons, reasons
        metrics = httpx.get(f"{agent.url}/metrics", timeout=5).text
        assert "linkpack_agent_device_plugin_resources 0.0" in metrics
        assert agent.stop() == 0, agent.log()
    assert "agent stopping" in agent.log()
    assert (_record(cp, node) or {})["metadata"]["generation"] == generation


# ---------------------------------------------------------------------- the device plugin


def _pod_with_record(name: str, record: Allocation) -> dict[str, Any]:
    annotations = {ALLOCATION_ANNOTATION: encode_allocation(record)}
    return api_pod_manifest(name, annotations=annotations, gpus=len(record.grants), limits_only=True)


def test_agent_serves_the_kubelet_from_allocation_records_in_the_api(
    linkpack_crd: ControlPlane, gpu_node: str, cluster_namespace: str, short_dir: Path
) -> None:
    """The agent's device plugin answers the kubelet from a pod's record in the API and writes the consumption back."""
    cp, node, ns = linkpack_crd, gpu_node, cluster_namespace
    kubelet = FakeKubelet(short_dir)
    kubelet.start()
    shim = short_dir / "shim"
    flags = [
        f"--device-plugin-dir={short_dir}",
        "--pod-resources-socket=",
        f"--shim-host-dir={shim}",
        "--units-per-gpu=4",
    ]
    try:
        with running_agent(cp, node, flags) as agent:
            gpus = decode_topology(_published(cp, node)["spec"]).gpus
            wait_until(lambda: len(kubelet.registered) == 2, 10, "both plugins registered", interval_s=0.05)
            assert sorted(p.name for p in shim.iterdir()) == ["linkpack_shim.py", "sitecustomize.py"]
            record = Allocation(
                node,
                (GpuGrant(1, gpus[1].uuid, True), GpuGrant(2, gpus[2].uuid, True)),
                resources=((GPU, 2),),
            )
            core = _core(cp)
            core.create_namespaced_pod(ns, _pod_with_record("train", record))
            assert bind_pod(cp.api_client(), ns, "train", node) == 201

            channel, plugin = plugin_stub(short_dir, GPU)
            with channel:
                stream = plugin.ListAndWatch(api.Empty(), timeout=30)
                assert {d.health for d in next(stream).devices} == {"Healthy"}
                agent.inject({"gpu": 3, "xid": 79})
                sick = next(stream)
                assert {d.ID for d in sick.devices if d.health == "Unhealthy"} == {gpus[3].uuid}
                stream.cancel()
                answer = plugin.Allocate(
                    api.AllocateRequest(
                        container_requests=[
                            api.ContainerAllocateRequest(devices_ids=[gpus[2].uuid, gpus[1].uuid])
                        ]
                    ),
                    timeout=10,
                )
            envs = answer.container_responses[0].envs
            assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpus[1].uuid},{gpus[2].uuid}"
            stored = core.read_namespaced_pod("train", ns).metadata.annotations
            consumed = decode_consumption(stored[CONSUMED_ANNOTATION])
            assert consumed.generation == 1 and consumed.containers == ("main",)
            metrics = httpx.get(f"{agent.url}/metrics", timeout=5).text
            assert 'linkpack_agent_allocations_total{result="granted"} 1.0' in metrics
            assert "linkpack_agent_device_plugin_resources 2.0" in metrics
            assert agent.stop() == 0, agent.log()
        assert not list(short_dir.glob("linkpack-*.sock"))  # the plugins took their sockets along
    finally:
        kubelet.stop()


def test_kube_pod_records_honour_resource_versions_of_the_api_server(
    linkpack_crd: ControlPlane, gpu_node: str, cluster_namespace: str
) -> None:
    """KubePodRecords honour the API server's resourceVersion preconditions and generations."""
    cp, node, ns = linkpack_crd, gpu_node, cluster_namespace
    core = _core(cp)
    record = Allocation(node, (GpuGrant(0, "GPU-00000000-0000-0000-0000-000000000000", True),))
    pod = _pod_with_record("records", record)
    pod["spec"]["initContainers"] = [
        {
            "name": "warm",
            "image": "registry.invalid/app:1",
            "resources": {"limits": {GPU: "1"}},
        }
    ]
    core.create_namespaced_pod(ns, pod)
    assert bind_pod(cp.api_client(), ns, "records", node) == 201
    store = KubePodRecords(KubernetesNodeApi.from_config(node, str(cp.kubeconfig_path)), node)
    (bound,) = [p for p in store.list_bound_pods_on_node() if p.ref.name == "records"]
    assert [(c.name, c.role) for c in bound.containers] == [
        ("warm", ContainerRole.INIT),
        ("main", ContainerRole.APP),
    ]
    created = core.read_namespaced_pod("records", ns)
    scheduled = next(c for c in created.status.conditions if c.type == "PodScheduled")
    assert bound.bound_at == scheduled.last_transition_time.timestamp()

    # Someone else writes after the listing: the remembered resourceVersion gets a real 409.
    core.patch_namespaced_pod("records", ns, {"metadata": {"labels": {"touched": "yes"}}})
    consumption = Consumption(1, ("main",), (record.grants[0].uuid,))
    assert store.mark_consumed(bound.ref, consumption) is True
    stored = core.read_namespaced_pod("records", ns).metadata
    assert decode_consumption(stored.annotations[CONSUMED_ANNOTATION]) == consumption
    assert stored.labels == {"touched": "yes"}

    # A record rewritten to generation 2 meanwhile: marking generation 1 is moot.
    rewritten = encode_allocation(Allocation(node, record.grants, generation=2))
    core.patch_namespaced_pod(
        "records", ns, {"metadata": {"annotations": {ALLOCATION_ANNOTATION: rewritten}}}
    )
    assert store.mark_consumed(bound.ref, consumption) is False
    core.delete_namespaced_pod("records", ns, grace_period_seconds=0)
    assert store.mark_consumed(bound.ref, Consumption(2, ("main",), ())) is False
