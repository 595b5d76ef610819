"""The simulated cluster: per-node free resources as numpy arrays, updated one node at a time.

Devices are padded to `MAX_GPUS` columns with 0 free milli, so a missing device never fits a
pod and adds nothing to any sum. `SimulatedCluster` is owned by one run and mutated only through
`assign`; everything policies read is exposed read-only by convention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.cluster.frag_table import BoolArray, FloatArray, FragTable, IntArray
from bench.cluster.trace import MILLI_PER_GPU, TraceNode, TracePod
from topology.fragmentation import Workload

MAX_GPUS = 8

#: Affinity tags of GpuClustering: index 0 is a GPU-sharing pod, index k a k-whole-GPU pod.
SHARE_TAG = 0


def affinity_tag(pod: TracePod) -> int | None:
    """The pod's GpuClustering tag; None for a CPU-only pod (it joins no group)."""
    if pod.gpu_count == 0:
        return None
    return SHARE_TAG if pod.is_fractional else pod.gpu_count


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a pod goes: a node index and the device indexes it takes (empty for CPU-only)."""

    node: int
    gpus: tuple[int, ...]


class SimulatedCluster:
    def __init__(self, nodes: tuple[TraceNode, ...], workload: Workload):
        self.nodes = nodes
        self.size = len(nodes)
        self.models = [n.model for n in nodes]
        self.gpu_count: IntArray = np.array([n.gpu_count for n in nodes], dtype=np.int64)
        self.cpu_capacity: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.cpu_left: IntArray = self.cpu_capacity.copy()
        self.memory_capacity: IntArray = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.memory_left: IntArray = self.memory_capacity.copy()
        self.gpu_left: IntArray = np.zeros((self.size, MAX_GPUS), dtype=np.int64)
        for i, node in enumerate(nodes):
            self.gpu_left[i, : node.gpu_count] = MILLI_PER_GPU
        self.gpu_left_total: IntArray = self.gpu_left.sum(axis=1)
        self.fully_free: IntArray = self.gpu_count.copy()
        self.largest_free: IntArray = self.gpu_left.max(axis=1)
        self.whole_held = np.zeros((self.size, MAX_GPUS), dtype=np.bool_)
        self.tags: IntArray = np.zeros((self.size, MAX_GPUS + 1), dtype=np.int64)
        self.total_gpu_milli = int(self.gpu_count.sum()) * MILLI_PER_GPU
        self.frag = FragTable(workload, self.models, self.gpu_left, self.cpu_left)
        self.version: IntArray = np.zeros(self.size, dtype=np.int64)
        self._model_masks: dict[tuple[str, ...], BoolArray] = {}

    # ------------------------------------------------------------------ reading

    def model_mask(self, models: tuple[str, ...]) -> BoolArray:
        """Nodes whose GPU model a pod accepts (every node when it names none)."""
        mask = self._model_masks.get(models)
        if mask is None:
            allowed = set(models)
            mask = np.array([not models or m in allowed for m in self.models], dtype=np.bool_)
            self._model_masks[models] = mask
        return mask

    def feasible(self, pod: TracePod) -> IntArray:
        """Nodes that pass the filter every policy shares (fgd.md §3.2), ascending."""
        ok = (self.cpu_left >= pod.cpu_milli) & (self.memory_left >= pod.memory_mib)
        if pod.gpu_count > 0:
            ok &= self.model_mask(pod.gpu_models)
            if pod.is_fractional:
                ok &= self.largest_free >= pod.gpu_milli
            else:
                ok &= self.fully_free >= pod.gpu_count
        return np.flatnonzero(ok)

    @property
    def allocated_gpu_milli(self) -> int:
        return self.total_gpu_milli - int(self.gpu_left_total.sum())

    @property
    def fragmentation_milli(self) -> float:
        return float(self.frag.values.sum())

    def tightest_device(self, node: int, milli: int) -> int:
        """`best` GPU selection for a share: least free device that fits, lowest index on ties."""
        row = self.gpu_left[node]
        candidates = np.where(row >= milli, row, MILLI_PER_GPU + 1)
        return int(np.argmin(candidates))

    def lowest_free_devices(self, node: int, count: int) -> tuple[int, ...]:
        """Whole-GPU selection under every method: the lowest-index fully free devices."""
        free = np.flatnonzero(self.gpu_left[node] == MILLI_PER_GPU)
        return tuple(int(i) for i in free[:count])

    def default_devices(self, node: int, pod: TracePod) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if pod.is_fractional:
            return (self.tightest_device(node, pod.gpu_milli),)
        return self.lowest_free_devices(node, pod.gpu_count)

    # ------------------------------------------------------------------ writing

    def assign(self, pod: TracePod, decision: Decision) -> None:
        """Book `pod` on the decision's node and devices and refresh that node's cached values."""
        j = decision.node
        self.cpu_left[j] -= pod.cpu_milli
        self.memory_left[j] -= pod.memory_mib
        row = self.gpu_left[j]
        for device in decision.gpus:
            if row[device] < pod.gpu_milli:
                raise ValueError(f"pod {pod.name}: device {device} of node {j} has only {row[device]} milli")
            row[device] -= pod.gpu_milli
            if not pod.is_fractional:
                self.whole_held[j, device] = True
        self.gpu_left_total[j] = int(row.sum())
        self.fully_free[j] = int((row == MILLI_PER_GPU).sum())
        self.largest_free[j] = int(row.max())
        tag = affinity_tag(pod)
        if tag is not None:
            self.tags[j, tag] += 1
        self.frag.refresh(j, row, int(self.cpu_left[j]))
        self.version[j] += 1

    def fragmentation_after(
        self, nodes: IntArray, pod: TracePod, devices_free: IntArray | None
    ) -> FloatArray:
        """F of each of `nodes` after a hypothetical placement of `pod`.

        For a share pod `devices_free` gives, per node, the free milli of the device it would
        take; whole-GPU and CPU-only pods take fully free GPUs (or none).
        """
        cpu_after = self.cpu_left[nodes] - pod.cpu_milli
        if pod.is_fractional:
            if devices_free is None:
                raise ValueError("a share pod needs the free milli of the chosen devices")
            return self.frag.after_share(nodes, devices_free, pod.gpu_milli, cpu_after)
        return self.frag.after_whole(nodes, pod.gpu_count, cpu_after)
