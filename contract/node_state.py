"""The one builder of a node's `NodeState`, the input of every placement decision.

A GPU is out of new placements when the node agent reports it unhealthy, when an operator
cordoned it (`contract.cordons`), or when the whole Node is unschedulable. The extender (filter,
prioritize, bind), its debug views and the kubectl plugin all build node states here, so they
cannot disagree about which GPUs are available.
"""

from __future__ import annotations

from collections.abc import Iterable

from contract.cordons import Cordons
from contract.gpu_topology import PublishedTopology
from contract.handoff import admits_pods
from topology.accounting import Overcommit, node_state_from_grants
from topology.scheduling import GpuGrant, NodeState, PowerLimit


def unavailable_by_operator(
    published: PublishedTopology, cordons: Cordons, unschedulable: bool
) -> frozenset[int]:
    """GPU indices kept out of new placements: cordoned GPUs, or all of an unschedulable Node or
    of a node whose device plugin does not take new pods now (`contract.handoff`)."""
    gpus = published.topology.gpus
    if unschedulable or not admits_pods(published.status.holds):
        return frozenset(g.index for g in gpus)
    return cordons.indices((g.index, g.uuid) for g in gpus)


def build_node_state(
    published: PublishedTopology,
    grants: Iterable[GpuGrant],
    units_per_gpu: int,
    cordons: Cordons | None = None,
    unschedulable: bool = False,
) -> tuple[NodeState, tuple[Overcommit, ...]]:
    """The node's state with these grants held, and any grant that does not fit (overcommit)."""
    return node_state_from_grants(
        published.node,
        published.topology,
        grants,
        units_per_gpu,
        published.status.unhealthy,
        unavailable_by_operator(published, cordons or Cordons(), unschedulable),
        power_limits(published),
    )


def power_limits(published: PublishedTopology) -> tuple[PowerLimit | None, ...]:
    """Each GPU's published power limit and range, in GPU order (empty when none is published)."""
    by_index = {p.index: PowerLimit(p.limit_w, p.min_w, p.max_w) for p in published.status.gpu_power}
    if not by_index:
        return ()
    return tuple(by_index.get(g.index) for g in published.topology.gpus)
