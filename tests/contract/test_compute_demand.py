"""A pod's effective CPU and memory request and a node's allocatable, as the scheduler counts them."""

from __future__ import annotations

from typing import Any

import pytest

from contract.compute_demand import ComputeDemand, node_allocatable_compute, pod_compute_demand
from tests.support.pods import container
from tests.support.resources import GPU

pytestmark = pytest.mark.timeout(30)


def _c(
    name: str, cpu: str = "", memory: str = "", limits_only: bool = False, always: bool = False
) -> dict[str, Any]:
    """A container asking for CPU and memory (requests, or limits alone); `always`: a sidecar."""
    amounts = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    return container(
        name,
        limits=amounts if limits_only else None,
        requests=None if limits_only else amounts,
        limits_only=True,
        image=None,
        restart_policy="Always" if always else "",
    )


def test_app_containers_add_up_and_units_round_up() -> None:
    """Two app containers: 500m + 0.25 cores and 1Gi + 1.5Mi of memory (rounded up to MiB)."""
    pod = {"spec": {"containers": [_c("a", "500m", "1Gi"), _c("b", "0.25", "1572864")]}}
    assert pod_compute_demand(pod) == ComputeDemand(750, 1026)


def test_an_init_container_counts_only_when_it_is_the_peak_and_sidecars_count_always() -> None:
    """Effective = max(apps + sidecars, init peak): a sidecar before a big init container adds to it."""
    pod = {
        "spec": {
            "initContainers": [_c("proxy", "1", always=True), _c("fetch", "6")],
            "containers": [_c("main", "2")],
        }
    }
    assert pod_compute_demand(pod).cpu_milli == 7000  # fetch (6) beside the sidecar (1) > 2 + 1


def test_limits_stand_in_for_requests_and_overhead_is_added() -> None:
    """A container with limits only requests its limits; RuntimeClass overhead comes on top."""
    pod = {
        "spec": {
            "containers": [_c("main", "2", "4Gi", limits_only=True)],
            "overhead": {"cpu": "100m", "memory": "64Mi"},
        }
    }
    assert pod_compute_demand(pod) == ComputeDemand(2100, 4160)


def test_unreadable_values_count_as_nothing_and_nodes_say_their_allocatable() -> None:
    """A bad quantity never raises; a node without both allocatable values is unknown."""
    assert pod_compute_demand({"spec": {"containers": [_c("main", "lots")]}}) == ComputeDemand()
    assert pod_compute_demand({"spec": "odd"}) == ComputeDemand()
    node = {"status": {"allocatable": {"cpu": "95500m", "memory": "393216Mi", GPU: "8"}}}
    assert node_allocatable_compute(node) == ComputeDemand(95_500, 393_216)
    assert node_allocatable_compute({"status": {"allocatable": {"cpu": "8"}}}) is None
