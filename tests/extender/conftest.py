"""Named hardware and an in-memory cluster for the extender's tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from contract.gpu_topology import as_published
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.snapshot import NodeFacts
from topology.model import Gpu, GpuLink, LinkKind, NodeTopology


def _gpus(n: int, model: str, memory: int, prefix: str, numa_split: int | None = None) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{prefix}-{i:04d}",
            model=model,
            memory_mib=memory,
            numa_node=(i // numa_split) if numa_split else 0,
        )
        for i in range(n)
    )


def hgx_h100(prefix: str = "h100") -> NodeTopology:
    """8x H100 SXM on NVSwitch: every pair NV18."""
    gpus = _gpus(8, "NVIDIA H100 80GB HBM3", 81559, prefix, numa_split=4)
    links = tuple(GpuLink(a, b, LinkKind.NV, 18) for a, b in itertools.combinations(range(8), 2))
    return NodeTopology(gpus=gpus, gpu_links=links, nvswitch=True)


def two_socket_pcie(prefix: str = "pcie") -> NodeTopology:
    """8x RTX 3090 on two sockets: NODE within a socket, SYS across."""
    gpus = _gpus(8, "NVIDIA GeForce RTX 3090", 24576, prefix, numa_split=4)
    links = tuple(
        GpuLink(a, b, LinkKind.NODE if a // 4 == b // 4 else LinkKind.SYS)
        for a, b in itertools.combinations(range(8), 2)
    )
    return NodeTopology(gpus=gpus, gpu_links=links)


@pytest.fixture
def config() -> ExtenderConfig:
    # These tests exercise filter and prioritize as a pair; deciding the node in filter (the
    # built-in default) is covered by tests/extender/test_node_decision.py.
    return ExtenderConfig(decide_node=False)


@pytest.fixture
def cluster(config: ExtenderConfig) -> InMemoryCluster:
    c = InMemoryCluster(config)
    c.add_node(NodeFacts("nv-node"), as_published("nv-node", hgx_h100()))
    c.add_node(NodeFacts("pcie-node"), as_published("pcie-node", two_socket_pcie()))
    c.add_node(NodeFacts("bare-node"), None)
    return c


@pytest.fixture
def service(config: ExtenderConfig, cluster: InMemoryCluster) -> Iterator[ExtenderService]:
    svc = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(svc), lambda: True)
    yield svc


_names = itertools.count()


def gpu_pod(
    name: str | None = None, *, gpus: int = 0, units: int = 0, memory: int = 0, **annotations: str
) -> dict[str, Any]:
    """A pod manifest as kube-scheduler sends it, asking for GPU resources."""
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if units:
        limits["nvidia.com/gpu.shared"] = str(units)
    if memory:
        limits["nvidia.com/gpu.memory"] = str(memory)
    pod_name = name or f"pod-{next(_names)}"
    return {
        "metadata": {
            "name": pod_name,
            "namespace": "ml",
            "annotations": {
                k.replace("_", "-").replace("linkpack-io-", "linkpack.io/"): v for k, v in annotations.items()
            },
        },
        "spec": {
            "schedulerName": "linkpack",
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "resources": {"limits": limits, "requests": dict(limits)},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def filter_args(pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": nodes}
