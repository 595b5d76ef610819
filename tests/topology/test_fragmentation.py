"""The FGD fragmentation measure reproduces the paper simulator's reference values (fgd.md §3.6)."""

from __future__ import annotations

import pytest

from topology.fragmentation import (
    DEFAULT_WORKLOAD,
    NodeResources,
    PodShape,
    TypicalRequest,
    fragmentation_delta,
    gpu_free_milli,
    node_fragmentation,
    node_resources_from_state,
    node_state_fragmentation,
    request_fragmentation,
    typical_workload_from,
)
from topology.model import Gpu, MigDevice, MigMode, NodeTopology
from topology.scheduling import GpuUsage, NodeState


def _shape(cpu: int, milli: int, count: int, percent: float, model: str = "") -> TypicalRequest:
    return TypicalRequest(
        gpu_milli=milli,
        gpu_count=count,
        cpu_milli=cpu,
        memory_mib=0,
        probability=percent / 100,
        gpu_models=(model,) if model else (),
    )


# The 35-shape test workload of the paper simulator's frag tests: (cpu, milli, count, %, model).
TYPICAL_35 = tuple(
    _shape(*row)
    for row in (
        (6000, 465, 1, 9.33),
        (8000, 440, 1, 9.15, "2080"),
        (8000, 475, 1, 8.76, "T4"),
        (8000, 440, 1, 8.72, "P100"),
        (2000, 465, 1, 8.68),
        (12000, 900, 1, 8.65),
        (4000, 900, 1, 8.43),
        (16000, 678, 1, 8.36, "T4"),
        (8000, 500, 1, 8.29),
        (6000, 511, 1, 8.11),
        (14000, 1000, 2, 0.54, "2080"),
        (4000, 1000, 1, 0.43, "2080"),
        (32000, 1000, 2, 0.43, "T4"),
        (16000, 1000, 1, 0.40, "V100M16"),
        (64000, 1000, 2, 0.40),
        (10000, 1000, 2, 0.40),
        (11400, 1000, 1, 0.36, "T4"),
        (16000, 1000, 1, 0.36, "T4"),
        (4000, 1000, 2, 0.36),
        (14000, 1000, 2, 0.36, "V100M16"),
        (8000, 1000, 4, 0.36),
        (16000, 1000, 2, 0.32),
        (2000, 1000, 1, 0.32, "T4"),
        (6000, 1000, 1, 0.32),
        (4000, 1000, 1, 0.32),
        (5000, 1000, 1, 0.32),
        (32000, 1000, 4, 0.32, "V100M16"),
        (32000, 1000, 2, 0.32),
        (24000, 1000, 8, 0.32, "2080"),
        (40000, 1000, 4, 0.29),
        (32000, 1000, 8, 0.29),
        (32000, 1000, 1, 0.29, "T4"),
        (16000, 1000, 1, 0.25),
        (7000, 1000, 1, 0.25, "V100M16"),
        (24000, 1000, 1, 0.25, "T4"),
    )
)

# The 31-shape test workload with CPU-only shapes: (cpu, milli, count, %).
TYPICAL_31_WITH_CPU_ONLY = tuple(
    _shape(*row)
    for row in (
        (15700, 1000, 1, 28.69),
        (11900, 1000, 1, 18.93),
        (11400, 1000, 1, 12.27),
        (1000, 0, 0, 7.36),
        (18710, 1000, 1, 4.85),
        (8200, 1000, 1, 3.79),
        (16400, 1000, 1, 3.31),
        (9810, 1000, 1, 1.97),
        (15200, 1000, 1, 1.87),
        (11200, 1000, 1, 1.81),
        (14200, 1000, 1, 1.76),
        (12000, 0, 0, 1.65),
        (14900, 1000, 1, 1.39),
        (60200, 1000, 4, 1.23),
        (64200, 1000, 8, 1.07),
        (32200, 1000, 4, 1.01),
        (17400, 1000, 2, 0.91),
        (30200, 1000, 2, 0.69),
        (16000, 1000, 1, 0.64),
        (15000, 1000, 1, 0.59),
        (64000, 1000, 8, 0.53),
        (15000, 0, 0, 0.53),
        (11910, 1000, 1, 0.53),
        (120200, 1000, 8, 0.48),
        (11300, 1000, 1, 0.37),
        (30000, 1000, 2, 0.32),
        (9800, 1000, 1, 0.32),
        (8000, 1000, 1, 0.32),
        (2000, 1000, 1, 0.27),
        (2000, 80, 1, 0.27),
        (1000, 1000, 1, 0.27),
    )
)


def test_one_shape_that_lacks_cpu_sees_all_idle_gpu_as_fragmented() -> None:
    workload = (_shape(6000, 465, 1, 9.33),)
    assert request_fragmentation((200, 1000, 1000, 500), 1000, None, "1080", workload[0]) == 2700
    assert node_fragmentation((200, 1000, 1000, 500), 1000, None, "1080", workload) == pytest.approx(
        251.91, abs=0.01
    )


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        ((200, 1000, 1000, 500), 2566.62),
        ((1000, 1000, 1000, 1000), 3802.40),
        ((1000,) * 8, 7604.80),
    ],
)
def test_typical_35_reference_values(free: tuple[int, ...], expected: float) -> None:
    assert node_fragmentation(free, 1000, None, "1080", TYPICAL_35) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(
    ("free", "cpu", "expected"),
    [
        ((1000,) * 8, 64000, 887.20),
        ((1000,) * 4 + (0,) * 4, 32000, 554.4),
        ((1000,) * 4 + (0,) * 4, 0, 4000.0),
    ],
)
def test_workload_with_cpu_only_shapes_reference_values(
    free: tuple[int, ...], cpu: int, expected: float
) -> None:
    value = node_fragmentation(free, cpu, None, "P100", TYPICAL_31_WITH_CPU_ONLY)
    assert value == pytest.approx(expected, abs=0.01)


def test_whole_gpu_request_counts_every_partial_gpu_as_a_fragment() -> None:
    two_whole = _shape(0, 1000, 2, 100)
    assert request_fragmentation((200, 1000, 1000, 500), None, None, "", two_whole) == 700


def test_paper_running_example_prefers_b_then_a() -> None:
    """Free ⟨0.5, 1.0⟩, M = {0.3, 0.5, 0.7} equally popular, CPU not binding (fgd.md §4.10.3)."""
    workload = tuple(
        TypicalRequest(gpu_milli=m, gpu_count=1, cpu_milli=0, memory_mib=0, probability=1 / 3)
        for m in (300, 500, 700)
    )

    def frag(free: tuple[int, ...]) -> float:
        return node_fragmentation(free, None, None, "", workload)

    assert frag((500, 1000)) == pytest.approx(1000 / 6)
    assert frag((200, 1000)) == pytest.approx(200)  # 0.3 on A
    assert frag((500, 700)) == pytest.approx(1000 / 6)  # 0.3 on B: Δ = 0
    assert frag((0, 700)) == pytest.approx(0)  # then 0.5 on A
    assert frag((500, 200)) == pytest.approx(1100 / 3)  # or 0.5 on B: +0.2
    before = NodeResources((500, 1000))
    assert fragmentation_delta(before, NodeResources((500, 700)), workload) == pytest.approx(0)
    assert fragmentation_delta(before, NodeResources((200, 1000)), workload) == pytest.approx(1000 / 30)


def test_gpu_model_and_memory_constraints_make_a_shape_a_misfit() -> None:
    typed = _shape(0, 500, 1, 100, "T4")
    assert request_fragmentation((1000, 300), None, None, "P100", typed) == 1300
    assert request_fragmentation((1000, 300), None, None, "T4", typed) == 300
    hungry = TypicalRequest(gpu_milli=500, gpu_count=1, cpu_milli=0, memory_mib=4096, probability=1)
    assert request_fragmentation((1000, 300), None, 1024, "", hungry) == 1300
    assert request_fragmentation((1000, 300), None, None, "", hungry) == 300


def test_typical_workload_keeps_the_popular_shapes_up_to_the_threshold_and_renormalises() -> None:
    pods = (
        [PodShape(cpu_milli=4000, gpu_milli=500, gpu_count=1)] * 60
        + [PodShape(cpu_milli=8000, gpu_milli=1000, gpu_count=1)] * 30
        + [PodShape(cpu_milli=2000, gpu_milli=0, gpu_count=0)] * 6
        + [PodShape(cpu_milli=9000, gpu_milli=1000, gpu_count=8)] * 4
    )
    workload = typical_workload_from(pods, popularity_threshold_percent=95)
    assert [(m.cpu_milli, m.gpu_milli, m.gpu_count) for m in workload] == [
        (4000, 500, 1),
        (8000, 1000, 1),
        (2000, 0, 0),
    ]
    assert [m.probability for m in workload] == pytest.approx([60 / 96, 30 / 96, 6 / 96])
    gpu_only = typical_workload_from(pods, popularity_threshold_percent=100, include_cpu_only=False)
    assert sum(m.probability for m in gpu_only) == pytest.approx(1)
    assert all(m.needs_gpu for m in gpu_only)


def test_typical_workload_breaks_count_ties_by_larger_shape_first() -> None:
    pods = [PodShape(1000, 500, 1)] * 5 + [PodShape(2000, 500, 1)] * 5
    workload = typical_workload_from(pods, popularity_threshold_percent=50)
    assert [(m.cpu_milli, m.probability) for m in workload] == [(2000, 1.0)]


def _node(usage: tuple[GpuUsage, ...], memory_mib: int = 16000) -> NodeState:
    gpus = tuple(Gpu(i, uuid=f"g{i}", model="T4", memory_mib=memory_mib) for i in range(len(usage)))
    return NodeState("n", NodeTopology(gpus=gpus), usage, units_per_gpu=100)


def test_node_state_free_share_is_the_scarcer_of_units_and_memory() -> None:
    node = _node(
        (
            GpuUsage(),
            GpuUsage(whole=True),
            GpuUsage(units_used=30, memory_used_mib=8000),
            GpuUsage(units_used=80, memory_used_mib=1000),
            GpuUsage(healthy=False),
        )
    )
    assert [gpu_free_milli(node, i) for i in range(5)] == [1000, 0, 500, 200, 0]
    resources = node_resources_from_state(node, free_cpu_milli=4000)
    assert resources == NodeResources((1000, 0, 500, 200, 0), 4000, None, "T4")


def test_mig_gpu_offers_the_share_of_its_unused_instances() -> None:
    migs = tuple(MigDevice(f"m{i}", "1g.10gb", i, 0, 10000) for i in range(4))
    gpu = Gpu(0, uuid="g0", model="A100", memory_mib=40000, mig_mode=MigMode.ENABLED, mig_devices=migs)
    node = NodeState("n", NodeTopology(gpus=(gpu,)), (GpuUsage(mig_used=frozenset({"m0"})),))
    assert gpu_free_milli(node, 0) == 750


def test_node_state_fragmentation_matches_the_raw_measure() -> None:
    node = _node((GpuUsage(units_used=50, memory_used_mib=100), GpuUsage()))
    assert node_state_fragmentation(node) == pytest.approx(
        node_fragmentation((500, 1000), None, None, "T4", DEFAULT_WORKLOAD)
    )
    assert sum(m.probability for m in DEFAULT_WORKLOAD) == pytest.approx(1)
    assert node_state_fragmentation(_node((GpuUsage(whole=True),) * 2)) == 0
