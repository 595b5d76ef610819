"""A Linkpack installation on the test control plane: GPU nodes, topology records, the
extender process and kube-scheduler running the shipped KubeSchedulerConfiguration."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from tests.cluster.controlplane import MANIFESTS, REPO_ROOT, ControlPlane, free_port
from topology.catalog import load_machine
from topology.codec import encode_topology
from topology.model import NodeTopology

#: (node name, catalog machine): NVSwitch, hybrid cube mesh, bridged pairs, two-socket PCIe.
GPU_NODES: tuple[tuple[str, str], ...] = (
    ("e2e-h100", "hgx-h100"),
    ("e2e-v100", "dgx1-v100"),
    ("e2e-pairs", "pcie-nv12-pairs"),
    ("e2e-3090", "rtx3090-2socket"),
)
UNITS_PER_GPU = 100


def node_topology(node: str, machine: str) -> NodeTopology:
    """The machine's topology with GPU UUIDs unique to this node."""
    t = load_machine(machine)
    gpus = tuple(
        replace(g, uuid=f"GPU-{node}-{g.index:02d}-0000-0000-000000000000", memory_mib=g.memory_mib or 81920)
        for g in t.gpus
    )
    return replace(t, gpus=gpus)


def publish_node(cp: ControlPlane, node: str, topology: NodeTopology) -> None:
    """A fake GPU node (no kubelet) and its GpuTopology record, as the node agent would publish."""
    gpus = topology.gpu_count
    cp.create_fake_node(
        node,
        {"nvidia.com/gpu": str(gpus), "nvidia.com/gpu.shared": str(gpus * UNITS_PER_GPU)},
        labels={"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": node},
    )
    custom = client.CustomObjectsApi(cp.api_client())
    custom.create_cluster_custom_object(
        "linkpack.io",
        "v1alpha1",
        "gputopologies",
        {
            "apiVersion": "linkpack.io/v1alpha1",
            "kind": "GpuTopology",
            "metadata": {"name": node},
            "spec": encode_topology(topology),
        },
    )


def scheduler_config(cp: ControlPlane, extender_url: str) -> str:
    text = (MANIFESTS / "scheduler-config.yaml").read_text()
    text = text.replace("/etc/kubernetes/scheduler.conf", str(cp.kubeconfig_path))
    return text.replace("http://linkpack-extender.linkpack-system.svc:8888", extender_url)


@dataclass
class ExtenderProcess:
    """`python -m extender` against the control plane, on a loopback port."""

    kubeconfig: Path
    log_path: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        self.port = self.port or free_port()
        env = {**os.environ, "LINKPACK_NAMESPACE": "linkpack-system", "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "extender",
                "--kubeconfig",
                str(self.kubeconfig),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "info",
            ],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"extender exited: {self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"extender not ready in {timeout_s}s: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


@contextlib.contextmanager
def running_extender(cp: ControlPlane, name: str = "extender", port: int = 0) -> Iterator[ExtenderProcess]:
    ext = ExtenderProcess(cp.kubeconfig_path, cp.log_dir / f"{name}.log", port)
    ext.start()
    try:
        yield ext
    finally:
        ext.kill()


def gpu_pod(
    name: str, *, gpus: int = 0, units: int = 0, memory: int = 0, node: str | None = None
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if units:
        limits["nvidia.com/gpu.shared"] = str(units)
    if memory:
        limits["nvidia.com/gpu.memory"] = str(memory)
    spec: dict[str, Any] = {
        "schedulerName": "linkpack",
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/app:1",
                "resources": {"limits": limits, "requests": limits},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
