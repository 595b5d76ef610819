"""One simulated run: pods arrive one at a time, pass the shared filter, and a policy places them.

A pod no node can take (or that the policy refuses) fails and is dropped: no retries, no
departures. After every pod the allocation and cluster fragmentation are recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.cluster.cluster import Decision, SimulatedCluster
from bench.cluster.frag_table import BoolArray, FloatArray, IntArray
from bench.cluster.policy import ClusterPolicy, PolicyFactory, RunContext
from bench.cluster.protocol import RunRecord, build_arrivals, policy_stream
from bench.cluster.topologies import topology_for
from bench.cluster.trace import MILLI_PER_GPU, TraceNode, TracePod
from topology.fragmentation import Workload
from topology.gpu_sets import BANDWIDTH_SCALE, link_table, mask_of


@dataclass(frozen=True, slots=True)
class RunSpec:
    trace: str
    policy: str
    seed: int


@dataclass(frozen=True, slots=True)
class Trajectory:
    """After each pod: cumulative arrived and allocated GPU milli, cluster F_N, whether it was placed."""

    arrived_milli: IntArray
    allocated_milli: IntArray
    fragmentation_milli: FloatArray
    placed: BoolArray
    links: LinkAudit


class LinkAudit:
    """How well connected the GPU sets of placed multi-GPU pods are, on the assumed topologies.

    Per pod: the ring bottleneck of the GPUs it got, and the best any set of that size of the
    node's free GPUs could reach (so a policy is judged on the node it picked).
    """

    def __init__(self) -> None:
        self.pods = 0
        self.on_best = 0
        self.gbps_total = 0.0

    def note(self, cluster: SimulatedCluster, pod: TracePod, decision: Decision) -> None:
        if pod.is_fractional or pod.gpu_count < 2:
            return
        node = decision.node
        table = link_table(topology_for(cluster.models[node], int(cluster.gpu_count[node])))
        free = mask_of([int(i) for i in np.flatnonzero(cluster.gpu_left[node] == MILLI_PER_GPU)])
        chosen = table.ring_bottleneck(mask_of(decision.gpus))
        self.pods += 1
        self.on_best += chosen >= table.best_ring_within(free, pod.gpu_count)
        self.gbps_total += chosen / BANDWIDTH_SCALE


def schedule(cluster: SimulatedCluster, arrivals: Sequence[TracePod], policy: ClusterPolicy) -> Trajectory:
    """Offer `arrivals` to `policy` one at a time, mutating `cluster`; failed pods are dropped."""
    count = len(arrivals)
    arrived = np.zeros(count, dtype=np.int64)
    allocated = np.zeros(count, dtype=np.int64)
    fragmentation = np.zeros(count, dtype=np.float64)
    placed = np.zeros(count, dtype=np.bool_)
    arrived_total = 0
    allocated_total = 0
    links = LinkAudit()
    observe = getattr(policy, "observe", None)  # a policy that learns from the pods it sees
    for step, pod in enumerate(arrivals):
        arrived_total += pod.gpu_total_milli
        if observe is not None:
            observe(pod)
        feasible = cluster.feasible(pod)
        decision = policy.decide(cluster, pod, feasible) if len(feasible) else None
        if decision is not None:
            links.note(cluster, pod, decision)
            cluster.assign(pod, decision)
            allocated_total += pod.gpu_total_milli
            placed[step] = True
        arrived[step] = arrived_total
        allocated[step] = allocated_total
        fragmentation[step] = cluster.frag.values.sum()
    return Trajectory(arrived, allocated, fragmentation, placed, links)


def simulate(
    spec: RunSpec,
    nodes: tuple[TraceNode, ...],
    pods: tuple[TracePod, ...],
    workload: Workload,
    factory: PolicyFactory,
    pod_limit: int | None = None,
    clock: Callable[[], float] = time.process_time,
) -> RunRecord:
    """One seed of the paper's protocol; `pod_limit` cuts the run short (tests).

    `seconds` in the record is `clock` time (CPU time of this process by default, which stays
    meaningful when other work shares the cores).
    """
    started = clock()
    cluster = SimulatedCluster(nodes, workload)
    arrivals = build_arrivals(pods, cluster.size, cluster.total_gpu_milli, spec.seed)
    policy = factory(RunContext(cluster, arrivals.node_priority, policy_stream(spec.seed), workload))
    order = arrivals.pod_order if pod_limit is None else arrivals.pod_order[:pod_limit]
    trajectory = schedule(cluster, [pods[i] for i in order], policy)
    return RunRecord(
        trace=spec.trace,
        policy=spec.policy,
        seed=spec.seed,
        capacity_milli=cluster.total_gpu_milli,
        arrived_milli=trajectory.arrived_milli,
        allocated_milli=trajectory.allocated_milli,
        fragmentation_milli=trajectory.fragmentation_milli,
        placed=trajectory.placed,
        seconds=clock() - started,
        multi_gpu_pods=trajectory.links.pods,
        multi_gpu_on_best=trajectory.links.on_best,
        multi_gpu_gbps=trajectory.links.gbps_total,
    )
