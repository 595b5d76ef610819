"""The paper's experiment protocol (fgd.md §2.5, §3.1 and §4): arrivals, node order, metrics.

Per seed: shuffle the trace, then inflate it with pods sampled with replacement until the GPU
requests reach 130% of cluster capacity (or drop random pods when the trace asks for more),
then draw a random node priority for tie-breaks. The paper's Go random stream cannot be
replayed, so per-seed runs differ from the paper's; distributions over seeds are compared.

Metric: after every pod, the allocated share of cluster GPU; events are bucketed by arrived GPU
request (whether or not the pod was placed) in whole percent of capacity, half to even.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.cluster.frag_table import FloatArray, IntArray
from bench.cluster.trace import TracePod

TARGET_LOAD = 1.3
CURVE_POINTS = np.arange(0, 131)


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The pods of one run, in arrival order (indexes into the name-sorted trace), and node ranks."""

    pod_order: tuple[int, ...]
    node_priority: IntArray


def build_arrivals(
    pods: tuple[TracePod, ...], node_count: int, capacity_milli: int, seed: int, target: float = TARGET_LOAD
) -> Arrivals:
    """Shuffle, then inflate to (or trim down to) `target` x capacity; then the node priority."""
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(len(pods))]
    total = sum(p.gpu_total_milli for p in pods)
    limit = target * capacity_milli
    if total < limit:
        while True:
            sample = int(rng.integers(len(pods)))
            # the paper's simulator compares with the per-GPU share, not the pod's total (a quirk kept)
            if total + pods[sample].gpu_milli > limit:
                break
            order.append(sample)
            total += pods[sample].gpu_total_milli
    else:
        while total > limit:
            drop = int(rng.integers(len(order)))
            total -= pods[order.pop(drop)].gpu_total_milli
    priority = rng.permutation(node_count).astype(np.int64)
    return Arrivals(tuple(order), priority)


def policy_stream(seed: int) -> np.random.Generator:
    """The random stream a policy may use (Random's picks), independent of the arrivals."""
    return np.random.default_rng([seed, 1])


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What happened after each pod of one run (arrays of equal length, one entry per pod)."""

    trace: str
    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: IntArray
    allocated_milli: IntArray
    fragmentation_milli: FloatArray
    placed: np.ndarray
    seconds: float
    #: placed 2/4/8-GPU pods, how many got the best ring their node's free GPUs offered, Σ ring GB/s
    multi_gpu_pods: int = 0
    multi_gpu_on_best: int = 0
    multi_gpu_gbps: float = 0.0

    @property
    def failed(self) -> int:
        return int((~self.placed).sum())


def bucket_means(record: RunRecord, values: FloatArray) -> FloatArray:
    """Mean of `values` per arrival percent 0..130 (neighbours ±1 where a bucket is empty)."""
    buckets = np.round(100.0 * record.arrived_milli / record.capacity_milli).astype(np.int64)
    out = np.full(len(CURVE_POINTS), np.nan)
    for x in CURVE_POINTS:
        hit = buckets == x
        if not hit.any():
            hit = np.abs(buckets - x) <= 1
        if hit.any():
            out[x] = float(values[hit].mean())
    return out


def unallocated_curve(record: RunRecord) -> FloatArray:
    """Unallocated GPU % of capacity per arrival percent 0..130."""
    allocated_pct = 100.0 * record.allocated_milli / record.capacity_milli
    return 100.0 - bucket_means(record, allocated_pct)


def fragmentation_rate_curve(record: RunRecord) -> FloatArray:
    """Cluster fragmentation rate (Eq 6, % of idle GPU) per arrival percent 0..130."""
    idle = record.capacity_milli - record.allocated_milli
    rate = 100.0 * record.fragmentation_milli / np.maximum(idle, 1)
    return bucket_means(record, rate)
