"""The FGD measure of `topology.fragmentation`, vectorised over nodes and cached per node.

For a workload M with per-GPU thresholds t_k (the distinct GPU shares in M), a node's
fragmentation only depends on, per threshold, S_k = Σ_g free_g·[free_g < t_k] (slivers too
small for the share) and C_k = #{g: free_g ≥ t_k} (GPUs that fit it), plus its idle total T
and free CPU:

    F = Σ_m p_m · (S_k(m) if shape m fits, else T)

`FragTable` keeps S, C and F for every node and refreshes one row when a node changes. A
hypothetical placement changes one device (a share) or takes whole free GPUs, so its S and C
follow from the cached row with a few array operations; that is what makes FGD cheap here.
`tests/bench/test_cluster_sim.py` checks the table against `topology.fragmentation` directly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from topology.fragmentation import Workload

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class FragTable:
    """Per-node fragmentation F_n(M) in milli-GPU, with the parts needed for fast deltas."""

    def __init__(self, workload: Workload, node_models: list[str], gpu_left: IntArray, cpu_left: IntArray):
        gpu_shapes = [m for m in workload if m.needs_gpu]
        thresholds = sorted({m.gpu_milli for m in gpu_shapes}) or [1]
        self.thresholds: IntArray = np.array(thresholds, dtype=np.int64)
        position = {t: k for k, t in enumerate(thresholds)}
        self.prob: FloatArray = np.array([m.probability for m in workload], dtype=np.float64)
        self.prob_sum = float(self.prob.sum())
        self.shape_cpu: IntArray = np.array([m.cpu_milli for m in workload], dtype=np.int64)
        self.shape_count: IntArray = np.array([m.gpu_count for m in workload], dtype=np.int64)
        self.shape_threshold: IntArray = np.array(
            [position.get(m.gpu_milli, 0) for m in workload], dtype=np.int64
        )
        self.access: BoolArray = np.array(
            [
                [m.needs_gpu and (not m.gpu_models or model in m.gpu_models) for m in workload]
                for model in node_models
            ],
            dtype=np.bool_,
        ).reshape(len(node_models), len(workload))
        self.slivers, self.fitting = self.parts(gpu_left)
        self.idle: IntArray = gpu_left.sum(axis=1)
        self.values: FloatArray = self.combine(
            self.slivers, self.fitting, self.idle, cpu_left, np.arange(len(node_models))
        )

    def parts(self, gpu_left: IntArray) -> tuple[IntArray, IntArray]:
        """(S, C) for rows of per-GPU free milli, shape (rows, K) each."""
        below = gpu_left[:, :, None] < self.thresholds[None, None, :]
        slivers = (gpu_left[:, :, None] * below).sum(axis=1)
        fitting = (~below).sum(axis=1)
        return slivers.astype(np.int64), fitting.astype(np.int64)

    def combine(
        self, slivers: IntArray, fitting: IntArray, idle: IntArray, cpu_left: IntArray, nodes: IntArray
    ) -> FloatArray:
        """F for hypothetical rows: parts (S, C, T, free CPU) of states on `nodes` (for GPU access)."""
        fits = (
            self.access[nodes]
            & (cpu_left[:, None] >= self.shape_cpu[None, :])
            & (fitting[:, self.shape_threshold] >= self.shape_count[None, :])
        )
        gap = (idle[:, None] - slivers[:, self.shape_threshold]) * fits
        result: FloatArray = idle * self.prob_sum - gap @ self.prob
        return result

    def refresh(self, node: int, gpu_left_row: IntArray, cpu_left: int) -> None:
        slivers, fitting = self.parts(gpu_left_row[None, :])
        self.slivers[node] = slivers[0]
        self.fitting[node] = fitting[0]
        self.idle[node] = int(gpu_left_row.sum())
        self.values[node] = self.combine(
            slivers, fitting, self.idle[node : node + 1], np.array([cpu_left]), np.array([node])
        )[0]

    def after_share(
        self, nodes: IntArray, free_before: IntArray, share: int, cpu_after: IntArray
    ) -> FloatArray:
        """F after taking `share` milli from one device with `free_before` milli on each of `nodes`."""
        free_after = free_before - share
        t = self.thresholds[None, :]
        before_col = free_before[:, None]
        after_col = free_after[:, None]
        slivers = self.slivers[nodes] - before_col * (before_col < t) + after_col * (after_col < t)
        fitting = self.fitting[nodes] - (before_col >= t) + (after_col >= t)
        return self.combine(slivers, fitting, self.idle[nodes] - share, cpu_after, nodes)

    def after_whole(self, nodes: IntArray, gpus: int, cpu_after: IntArray) -> FloatArray:
        """F after taking `gpus` fully free GPUs (0 for a CPU-only pod) on each of `nodes`."""
        fitting = self.fitting[nodes] - gpus
        return self.combine(self.slivers[nodes], fitting, self.idle[nodes] - 1000 * gpus, cpu_after, nodes)
