"""The words the debug page and the kubectl plugin use for a GPU's state and a node's model."""

from __future__ import annotations

import pytest

from topology.gpu_status import GPU_STATUSES, gpu_status, model_of
from topology.model import Gpu, NodeTopology
from topology.scheduling import GpuUsage, NodeState


def _state(*models: str) -> NodeState:
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i}", model=m, memory_mib=1024) for i, m in enumerate(models))
    return NodeState.empty("n", NodeTopology(gpus=gpus))


@pytest.mark.parametrize(
    ("usage", "status"),
    [
        (GpuUsage(), "free"),
        (GpuUsage(memory_used_mib=1), "shared"),
        (GpuUsage(units_used=10), "shared"),
        (GpuUsage(mig_used=frozenset({"MIG-1"})), "shared"),
        (GpuUsage(whole=True), "whole"),
        (GpuUsage(cordoned=True), "cordoned"),
        (GpuUsage(whole=True, cordoned=True), "cordoned"),
        (GpuUsage(healthy=False, cordoned=True), "unhealthy"),
        (GpuUsage(whole=True, healthy=False), "unhealthy"),
    ],
)
def test_each_gpu_gets_one_word_health_and_cordons_first(usage: GpuUsage, status: str) -> None:
    assert gpu_status(usage) == status
    assert status in GPU_STATUSES


def test_the_statuses_are_listed_in_legend_order() -> None:
    assert GPU_STATUSES == ("free", "shared", "whole", "unhealthy", "cordoned")


def test_the_model_of_a_node() -> None:
    assert model_of(_state("H100", "H100")) == "H100"
    assert model_of(_state("L4", "", "A10")) == "mixed: A10, L4"
    assert model_of(_state("", "")) == ""
