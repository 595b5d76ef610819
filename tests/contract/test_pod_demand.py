"""The effective-request rule of `contract.pod_demand`, on named pods and as properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.pod_demand import (
    ContainerDemand,
    ContainerRole,
    PodSpecError,
    container_demands,
    effective_amount,
    effective_amounts,
)
from tests.contract.pod_fixtures import CASES, Case, container, pod
from tests.support.resources import GPU

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.manifest["metadata"]["name"])
def test_effective_request_matches_kubernetes(case: Case) -> None:
    """Each fixture's effective request is the one the kubelet admits the pod against."""
    demands = container_demands(case.manifest["spec"], lambda name: name.startswith("nvidia.com/"))
    assert effective_amounts(demands) == case.effective, case.description


def test_roles_follow_restart_policy_and_spec_order() -> None:
    """Init containers come first in spec order, sidecars marked by restartPolicy Always."""
    manifest = pod(
        "roles",
        [container("main", gpu="1")],
        init=[container("prep", gpu="1"), container("proxy", "Always", gpu="1")],
    )
    demands = container_demands(manifest["spec"], lambda n: n == GPU)
    assert [(d.name, d.role) for d in demands] == [
        ("prep", ContainerRole.INIT),
        ("proxy", ContainerRole.SIDECAR),
        ("main", ContainerRole.APP),
    ]
    assert [d.keeps_devices for d in demands] == [False, True, True]


def test_requests_override_limits() -> None:
    """A request given beside a limit is the amount read (the API server requires them equal)."""
    spec = {"containers": [{"name": "m", "resources": {"limits": {GPU: "2"}, "requests": {GPU: "2"}}}]}
    assert effective_amounts(container_demands(spec, lambda n: n == GPU)) == {GPU: 2}


@pytest.mark.parametrize("bad", ["1.5", "-1", "lots", "500m"])
def test_a_fractional_or_junk_quantity_names_the_container(bad: str) -> None:
    """Extended resources are whole numbers; anything else is an error naming container and resource."""
    spec = {"containers": [{"name": "trainer", "resources": {"limits": {GPU: bad}}}]}
    with pytest.raises(PodSpecError, match=rf"container trainer: {GPU}="):
        container_demands(spec, lambda n: n == GPU)


roles = st.sampled_from(list(ContainerRole))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(roles, st.integers(0, 8)), max_size=8))
def test_effective_request_bounds(parts: list[tuple[ContainerRole, int]]) -> None:
    """The effective request is at least every long-running sum and every single container,
    and at most the sum of all containers."""
    demands = [ContainerDemand(f"c{i}", role, ((GPU, n),) if n else ()) for i, (role, n) in enumerate(parts)]
    inits = [d for d in demands if d.role is not ContainerRole.APP]
    apps = [d for d in demands if d.role is ContainerRole.APP]
    demands = inits + apps
    total = effective_amount(demands, GPU)
    kept = sum(d.amount(GPU) for d in demands if d.keeps_devices)
    assert total >= kept
    assert all(total >= d.amount(GPU) for d in demands)
    assert total <= sum(d.amount(GPU) for d in demands)
