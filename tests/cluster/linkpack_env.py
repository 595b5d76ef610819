"""A Linkpack installation on the test control plane: GPU nodes, topology records, the
extender process and kube-scheduler running the shipped KubeSchedulerConfiguration."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.controlplane import (
    REPO_ROOT,
    ControlPlane,
    delete_fake_node,
    free_port,
    render_scheduler_config,
)
from tests.support.resources import GPU, SHARED
from tests.tls_certs import TlsSet, issue_tls_set, tls_set_in
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
#: the label every node has, naming it (what a pod kept to one node selects)
HOSTNAME = "kubernetes.io/hostname"


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
        {GPU: str(gpus), SHARED: str(gpus * UNITS_PER_GPU)},
        labels={"nvidia.com/gpu.present": "true", HOSTNAME: node},
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


def unpublish_node(cp: ControlPlane, node: str) -> None:
    """Remove a `publish_node` node and its GpuTopology record (either may already be gone)."""
    delete_fake_node(cp.api_client(), node)
    with contextlib.suppress(ApiException):
        client.CustomObjectsApi(cp.api_client()).delete_cluster_custom_object(
            "linkpack.io", "v1alpha1", "gputopologies", node
        )


@contextlib.contextmanager
def published_nodes(cp: ControlPlane, topologies: Mapping[str, NodeTopology]) -> Iterator[None]:
    """`publish_node` for each node, all removed again on exit: the session's control plane is
    shared, and a GPU node left behind would be offered to the pods of every later test."""
    try:
        for node, topology in topologies.items():
            publish_node(cp, node, topology)
        yield
    finally:
        for node in topologies:
            unpublish_node(cp, node)


def scheduler_config(cp: ControlPlane, extender_url: str, tls: TlsSet | None = None) -> str:
    """The shipped scheduler configuration pointed at this control plane and extender."""
    return render_scheduler_config(extender_url, cp.kubeconfig_path, tls)


@dataclass
class ExtenderProcess:
    """`python -m extender` against the control plane, on loopback ports, with test certificates."""

    kubeconfig: Path
    log_path: Path
    tls: TlsSet
    port: int = 0
    debug_port: int = 0
    ops_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The verbs (mutual TLS)."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def debug_url(self) -> str:
        return f"https://127.0.0.1:{self.debug_port}"

    @property
    def ops_url(self) -> str:
        return f"http://127.0.0.1:{self.ops_port}"

    def scheduler_client(self) -> httpx.Client:
        """An HTTPS client holding the scheduler's client certificate (what the verbs require)."""
        context = ssl.create_default_context(cafile=str(self.tls.server_ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return httpx.Client(verify=context, timeout=30)

    def start(self, timeout_s: float = 180.0) -> None:
        self.port = self.port or free_port()
        self.debug_port = self.debug_port or free_port()
        self.ops_port = self.ops_port or free_port()
        env = {
            **os.environ,
            "LINKPACK_NAMESPACE": "linkpack-system",
            "PYTHONUNBUFFERED": "1",
            "LINKPACK_TLS_CERT_FILE": str(self.tls.server_cert),
            "LINKPACK_TLS_KEY_FILE": str(self.tls.server_key),
            "LINKPACK_CLIENT_CA_FILE": str(self.tls.client_ca),
        }
        with self.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
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
                    "--debug-port",
                    str(self.debug_port),
                    "--ops-port",
                    str(self.ops_port),
                    "--log-level",
                    "info",
                ],
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"extender exited: {self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                reply = httpx.get(f"{self.ops_url}/readyz", timeout=2)
                if reply.status_code == 200:
                    return
                last = reply.text
            time.sleep(0.2)
        raise RuntimeError(
            f"extender not ready in {timeout_s}s (/readyz: {last}): {self.log_path.read_text()[-3000:]}"
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def extender_tls(cp: ControlPlane) -> TlsSet:
    """The control plane's test certificates for the extender and the scheduler (made once)."""
    directory = cp.log_dir / "tls"
    if not (directory / "client.key").exists():
        issue_tls_set(directory)
    return tls_set_in(directory)


@contextlib.contextmanager
def running_extender(cp: ControlPlane, name: str = "extender", port: int = 0) -> Iterator[ExtenderProcess]:
    ext = ExtenderProcess(cp.kubeconfig_path, cp.log_dir / f"{name}.log", extender_tls(cp), port)
    ext.start()
    try:
        yield ext
    finally:
        ext.kill()


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
