"""FGD: place each pod where the fragmentation of the target workload grows least (fgd.md §2.3, §3.4).

Faithful mode reproduces the paper's scheduler plugin: score = int(100 · sigmoid(-ΔF / 1000)),
so small differences tie and go to the node priority; a share goes to the first device (by
index) reaching the node's best score. Ideal mode ranks by the raw -ΔF instead.

Devices of a node with the same free milli give the same hypothetical state, so each node is
tried once per distinct free value (its lowest index standing for the rest).
"""

from __future__ import annotations

import numpy as np

from bench.cluster.cluster import Decision, SimulatedCluster
from bench.cluster.frag_table import FloatArray, IntArray
from bench.cluster.policy import ClusterPolicy, RunContext, pick_best
from bench.cluster.trace import TracePod


def sigmoid_scores(gain: FloatArray) -> IntArray:
    """The plugin's integer score of a fragmentation gain (F before - F after, milli-GPU)."""
    return np.trunc(100.0 / (1.0 + np.exp(-gain / 1000.0))).astype(np.int64)


def share_candidates(rows: IntArray, share: int) -> tuple[IntArray, IntArray, IntArray]:
    """(row, device, free milli) of each distinct free value ≥ `share` per row, lowest index first."""
    order = np.argsort(rows, axis=1, kind="stable")
    values = np.take_along_axis(rows, order, axis=1)
    first = np.ones(values.shape, dtype=np.bool_)
    first[:, 1:] = values[:, 1:] != values[:, :-1]
    row, col = np.nonzero(first & (values >= share))
    return row, order[row, col], values[row, col]


def best_per_row(row: IntArray, score: np.ndarray, device: IntArray) -> tuple[IntArray, np.ndarray, IntArray]:
    """Per row (rows ascending in `row`): the best score, and the lowest device reaching it."""
    order = np.lexsort((device, -score, row))
    row_sorted = row[order]
    heads = order[np.r_[True, row_sorted[1:] != row_sorted[:-1]]]
    return row[heads], score[heads], device[heads]


class FgdPolicy:
    def __init__(self, context: RunContext, faithful: bool = True):
        self.priority = context.priority
        self.faithful = faithful

    def _scores(self, gain: FloatArray) -> np.ndarray:
        # ideal: round away float noise so equal gains tie and go to the node priority
        return sigmoid_scores(gain) if self.faithful else np.round(gain, 6)

    def decide(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> Decision:
        before = cluster.frag.values[feasible]
        if not pod.is_fractional:
            after = cluster.fragmentation_after(feasible, pod, None)
            node = pick_best(self._scores(before - after), feasible, self.priority)
            return Decision(node, cluster.lowest_free_devices(node, pod.gpu_count))
        row, device, free = share_candidates(cluster.gpu_left[feasible], pod.gpu_milli)
        after = cluster.fragmentation_after(feasible[row], pod, free)
        scores = self._scores(before[row] - after)
        rows, best, devices = best_per_row(row, scores, device)
        nodes = feasible[rows]
        node = pick_best(best, nodes, self.priority)
        return Decision(node, (int(devices[np.flatnonzero(nodes == node)[0]]),))


def fgd_policy(context: RunContext) -> ClusterPolicy:
    return FgdPolicy(context, faithful=True)


def fgd_ideal_policy(context: RunContext) -> ClusterPolicy:
    return FgdPolicy(context, faithful=False)
