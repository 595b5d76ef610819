"""Node states from grants: usage, health and cordon marks, and the overcommits found on the way."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from topology.accounting import accumulate, node_state_from_grants
from topology.catalog import load_machine
from topology.scheduling import GpuGrant, GpuUsage

H100 = load_machine("hgx-h100")

grants = st.lists(
    st.builds(
        GpuGrant,
        index=st.integers(-1, 9),
        uuid=st.just(""),
        whole=st.booleans(),
        memory_mib=st.integers(0, 90000),
        units=st.integers(0, 120),
        mig_uuid=st.sampled_from(["", "", "MIG-a", "MIG-b"]),
        power_w=st.integers(0, 400),
    ),
    max_size=12,
)
indices = st.frozensets(st.integers(0, 7))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(grants, indices, indices)
def test_marks_and_usage_are_those_of_the_unmarked_usage_marked_afterwards(
    held: list[GpuGrant], unhealthy: frozenset[int], cordoned: frozenset[int]
) -> None:
    """Random grants (some beyond capacity or naming GPUs the node lacks) with random unhealthy and
    cordoned GPUs: the node's usage is the unmarked usage with each GPU's marks set, and the same
    overcommits are reported."""
    plain, plain_problems = accumulate(H100, held, 100)
    state, problems = node_state_from_grants("n", H100, held, 100, unhealthy, cordoned)
    expected = tuple(
        replace(u, healthy=i not in unhealthy, cordoned=i in cordoned) for i, u in enumerate(plain)
    )
    assert state.usage == expected
    assert problems == plain_problems


def test_idle_gpus_share_one_usage_value_per_marking() -> None:
    """GPUs with nothing granted get equal, shared usage values; a granted GPU gets its own."""
    state, _ = node_state_from_grants(
        "n", H100, [GpuGrant(2, "", True)], 100, unhealthy=frozenset({5}), cordoned=frozenset({6})
    )
    usage = state.usage
    assert usage[0] is usage[1] and usage[0] == GpuUsage()
    assert usage[5] == GpuUsage(healthy=False) and usage[6] == GpuUsage(cordoned=True)
    assert usage[2] == GpuUsage(whole=True)


def _summed_directly(held: list[GpuGrant], units_per_gpu: int) -> tuple[tuple[GpuUsage, ...], set[str]]:
    """Each GPU's usage summed straight from the grants, and the overcommits' texts."""
    usage, problems = [], set()
    for i, gpu in enumerate(H100.gpus):
        mine = [g for g in held if g.index == i]
        whole = sum(1 for g in mine if g.whole)
        shares = [g for g in mine if not g.whole and not g.mig_uuid]
        migs = [g.mig_uuid for g in mine if not g.whole and g.mig_uuid]
        memory, units = sum(g.memory_mib for g in shares), sum(g.units for g in shares)
        if len(set(migs)) < len(migs):
            problems.update(f"MIG instance {m} granted twice" for m in migs if migs.count(m) > 1)
        shared = memory > 0 or units > 0 or bool(migs)
        if whole > 1 or (whole and shared):
            problems.add(f"GPU {i} held whole {whole}x and shared={shared}")
        if memory > gpu.memory_mib:
            problems.add(f"GPU {i}: {memory} MiB granted of {gpu.memory_mib} MiB")
        if units > units_per_gpu:
            problems.add(f"GPU {i}: {units} share units granted of {units_per_gpu}")
        usage.append(
            GpuUsage(
                whole=whole > 0,
                memory_used_mib=memory,
                units_used=units,
                mig_used=frozenset(migs),
                sharers=len(shares),
                power_used_w=sum(g.power_w for g in mine),
            )
        )
    problems.update(f"grant names GPU {g.index}, the node has 8" for g in held if not 0 <= g.index < 8)
    return tuple(usage), problems


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(grants)
def test_usage_and_overcommits_are_the_grants_summed_per_gpu(held: list[GpuGrant]) -> None:
    """Random grants, some beyond capacity, some naming GPUs the node lacks, some MIG instances
    granted twice: each GPU's usage is its grants summed, and every overcommit is reported."""
    usage, problems = accumulate(H100, held, 100)
    expected_usage, expected_problems = _summed_directly(held, 100)
    assert usage == expected_usage
    assert {p.detail for p in problems} == expected_problems
