"""Properties of `place` on small random nodes: capacity, freeness, oracle agreement, determinism."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from topology.model import Gpu, GpuLink, LinkKind, Nic, NicLink, NodeTopology
from topology.oracle import oracle_best_set
from topology.placement import apply_placement, place, release_placement
from topology.scheduling import GpuShare, GpuUsage, Misfit, NodeState, Placement, Request, WholeGpus

LINK_CHOICES = [
    (LinkKind.NV, 1),
    (LinkKind.NV, 2),
    (LinkKind.NV, 4),
    (LinkKind.NV, 12),
    (LinkKind.PIX, 0),
    (LinkKind.PXB, 0),
    (LinkKind.PHB, 0),
    (LinkKind.NODE, 0),
    (LinkKind.SYS, 0),
]
NIC_KINDS = [LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE, LinkKind.SYS]


@st.composite
def topologies(draw: st.DrawFn, max_gpus: int = 6) -> NodeTopology:
    n = draw(st.integers(1, max_gpus))
    # Few distinct link kinds per node, as on real hardware; sometimes everything equal.
    palette = draw(st.lists(st.sampled_from(LINK_CHOICES), min_size=1, max_size=4, unique=True))
    numa = draw(st.lists(st.sampled_from([None, 0, 1]), min_size=n, max_size=n))
    gpus = tuple(Gpu(i, f"GPU-{i}", "A100-SXM4-40GB", 40960, numa_node=numa[i]) for i in range(n))
    links = tuple(GpuLink(a, b, *draw(st.sampled_from(palette))) for a, b in combinations(range(n), 2))
    has_nic = draw(st.booleans())
    nics = (Nic(0, "mlx5_0"),) if has_nic else ()
    nic_links = tuple(NicLink(g, 0, draw(st.sampled_from(NIC_KINDS))) for g in range(n)) if has_nic else ()
    return NodeTopology(gpus=gpus, gpu_links=links, nics=nics, nic_links=nic_links)


@st.composite
def nodes(draw: st.DrawFn, max_gpus: int = 6) -> NodeState:
    topology = draw(topologies(max_gpus))
    usage = []
    for _ in topology.gpus:
        kind = draw(st.sampled_from(["free", "free", "free", "whole", "shared", "sick", "cordoned"]))
        usage.append(
            GpuUsage(
                whole=kind == "whole",
                units_used=30 if kind == "shared" else 0,
                memory_used_mib=8192 if kind == "shared" else 0,
                healthy=kind != "sick",
                cordoned=kind == "cordoned",
            )
        )
    return NodeState("n", topology, tuple(usage))


@st.composite
def whole_requests(draw: st.DrawFn, node: NodeState) -> WholeGpus:
    count = draw(st.integers(1, max(1, node.topology.gpu_count)))
    wants_nic = bool(node.topology.nics) and draw(st.booleans())
    near = "mlx5_0" if wants_nic else None
    return WholeGpus(count, near_nic=near)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_whole_gpu_placement_agrees_with_the_exhaustive_oracle(data: st.DataObject) -> None:
    node = data.draw(nodes())
    request = data.draw(whole_requests(node))
    outcome = place(node, request)
    expected = oracle_best_set(node, request)
    if expected is None:
        assert isinstance(outcome, Misfit)
    else:
        assert isinstance(outcome, Placement)
        assert outcome.gpus == expected.gpus


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_placed_gpus_are_free_usable_and_apply_cleanly(data: st.DataObject) -> None:
    node = data.draw(nodes())
    request: Request = data.draw(
        st.one_of(
            whole_requests(node),
            st.builds(GpuShare, memory_mib=st.integers(0, 50_000), units=st.integers(0, 120)),
        )
    )
    outcome = place(node, request)
    if isinstance(outcome, Misfit):
        return
    for index in outcome.gpus:
        usage = node.usage[index]
        assert usage.usable and not usage.whole
        if isinstance(request, WholeGpus):
            assert usage.idle
    after = apply_placement(node, outcome)  # raises on over-allocation
    assert release_placement(after, outcome) == node


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_stream_of_shares_never_exceeds_capacity(data: st.DataObject) -> None:
    node = data.draw(nodes(max_gpus=4))
    shares = data.draw(
        st.lists(
            st.builds(GpuShare, memory_mib=st.integers(0, 30_000), units=st.integers(0, 100)), max_size=25
        )
    )
    for share in shares:
        outcome = place(node, share)
        if isinstance(outcome, Placement):
            node = apply_placement(node, outcome)
    for index, usage in enumerate(node.usage):
        assert usage.units_used <= node.units_per_gpu
        assert usage.memory_used_mib <= node.topology.gpus[index].memory_mib


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_placement_is_deterministic(data: st.DataObject) -> None:
    node = data.draw(nodes(max_gpus=8))
    request = data.draw(whole_requests(node))
    assert place(node, request) == place(node, request)
