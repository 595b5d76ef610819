"""The paper's baselines (fgd.md §2.4), scored with the simulator's exact integer formulas (§3.4).

Each `*_scores` function is pure: it maps the feasible nodes of a cluster and a pod to int
scores 0..100 (higher wins; ties go to the node priority). GPU selection is `best` (tightest
fitting device for a share, lowest-index free GPUs for whole GPUs) except Random's, which is
uniform over the fitting devices.

BestFit's min-max NormalizeScore is left out: with scores in 0..100 it is strictly
increasing, so it never changes which node wins.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bench.cluster.cluster import Decision, SimulatedCluster, affinity_tag
from bench.cluster.frag_table import IntArray
from bench.cluster.policy import ClusterPolicy, RunContext, pick_best
from bench.cluster.trace import MILLI_PER_GPU, TracePod

ScoreFunction = Callable[[SimulatedCluster, TracePod, IntArray], IntArray]

#: Normalisers of the paper's simulator: the largest node's CPU and GPU (MaxSpecCpu, MaxSpecGpu).
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def bestfit_scores(cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> IntArray:
    """Least remaining CPU and GPU (each normalised, weighted ½) after the pod scores highest."""
    cpu_after = cluster.cpu_left[feasible] - pod.cpu_milli
    gpu_after = cluster.gpu_left_total[feasible] - pod.gpu_total_milli
    raw = 0.5 * cpu_after / MAX_SPEC_CPU + 0.5 * gpu_after / MAX_SPEC_GPU
    return np.trunc((1.0 - raw) * 100).astype(np.int64)


def dotprod_scores(cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> IntArray:
    """Smallest dot product of the node's free (CPU, GPU) vector with the pod's scores highest."""
    node_cpu = cluster.cpu_left[feasible] / MAX_SPEC_CPU
    node_gpu = cluster.gpu_left_total[feasible] / MAX_SPEC_GPU
    dot = node_cpu * (pod.cpu_milli / MAX_SPEC_CPU) + node_gpu * (pod.gpu_total_milli / MAX_SPEC_GPU)
    return np.trunc(100 * (1.0 - dot / 2)).astype(np.int64)


def clustering_scores(cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> IntArray:
    """Gandiva-style GPU clustering: prefer nodes that host only pods with the same GPU request."""
    tag = affinity_tag(pod)
    if tag is None:
        return np.zeros(len(feasible), dtype=np.int64)
    tags = cluster.tags[feasible]
    own = tags[:, tag] > 0
    total = tags.sum(axis=1)
    others = (total - tags[:, tag]) > 0
    base = (25 * (MAX_SPEC_GPU - cluster.gpu_left_total[feasible])) // MAX_SPEC_GPU
    bonus = np.where(own & ~others, 75, np.where(own, 50, np.where(total == 0, 25, 0)))
    return (base + bonus).astype(np.int64)


def packing_scores(cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> IntArray:
    """GPU packing (MLaaS): occupied GPUs first, then free GPUs on occupied nodes, then idle nodes."""
    if pod.gpu_count == 0:
        return np.zeros(len(feasible), dtype=np.int64)
    count = cluster.gpu_count[feasible]
    idle_node = np.maximum(33 - count, count)
    if pod.is_fractional:
        rows = cluster.gpu_left[feasible]
        tightest = np.where(rows >= pod.gpu_milli, rows, MILLI_PER_GPU + 1).min(axis=1)
        on_free_gpu = max(50 - 1, 33)
        on_used_gpu = np.maximum(100 - (tightest * 100 // MILLI_PER_GPU) // 10, 50)
        occupied_node = np.where(tightest == MILLI_PER_GPU, on_free_gpu, on_used_gpu)
    else:
        occupied_node = np.full(len(feasible), max(50 - pod.gpu_count, 33))
    all_free = cluster.fully_free[feasible] == count
    return np.where(all_free, idle_node, occupied_node).astype(np.int64)


class ScoredPolicy:
    """A baseline from a vectorised score function, with `best` GPU selection."""

    def __init__(self, context: RunContext, score: ScoreFunction):
        self.priority = context.priority
        self.score = score

    def decide(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> Decision:
        node = pick_best(self.score(cluster, pod, feasible), feasible, self.priority)
        return Decision(node, cluster.default_devices(node, pod))


class RandomPolicy:
    """A uniformly random feasible node; a share goes to a uniformly random fitting device."""

    def __init__(self, context: RunContext):
        self.rng = context.rng

    def decide(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> Decision:
        node = int(feasible[self.rng.integers(len(feasible))])
        if pod.is_fractional:
            fitting = np.flatnonzero(cluster.gpu_left[node] >= pod.gpu_milli)
            return Decision(node, (int(fitting[self.rng.integers(len(fitting))]),))
        return Decision(node, cluster.default_devices(node, pod))


def random_policy(context: RunContext) -> ClusterPolicy:
    return RandomPolicy(context)


def bestfit_policy(context: RunContext) -> ClusterPolicy:
    return ScoredPolicy(context, bestfit_scores)


def dotprod_policy(context: RunContext) -> ClusterPolicy:
    return ScoredPolicy(context, dotprod_scores)


def clustering_policy(context: RunContext) -> ClusterPolicy:
    return ScoredPolicy(context, clustering_scores)


def packing_policy(context: RunContext) -> ClusterPolicy:
    return ScoredPolicy(context, packing_scores)
