"""The openb trace (Alibaba cluster-trace-gpu-v2023): node list and pod lists, as plain records.

Files live under `$LINKPACK_SHARED/data/openb/` (default `../shared` next to the repository
root). Column meanings are in `reference/fgd.md` §1.1; only the columns the paper's simulator
reads are kept (qos, phase and the time columns are ignored).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from topology.fragmentation import PodShape, Workload, typical_workload_from

MILLI_PER_GPU = 1000
REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_FILE = "openb_node_list_gpu_node.csv"
PAPER_SUMMARY_FILE = "paper_results/summary_by_workload_policy.csv"


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod: `gpu_milli` is the share of each of its `gpu_count` GPUs (0 for CPU-only pods)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    gpu_models: tuple[str, ...] = ()

    @property
    def gpu_total_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    @property
    def is_fractional(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI_PER_GPU

    @property
    def shape(self) -> PodShape:
        return PodShape(self.cpu_milli, self.gpu_milli, self.gpu_count, 0, self.gpu_models)


def shared_root() -> Path:
    """`$LINKPACK_SHARED`, or `../shared` relative to the repository root."""
    configured = os.environ.get("LINKPACK_SHARED")
    return Path(configured) if configured else (REPO_ROOT.parent / "shared").resolve()


def openb_dir(root: Path | None = None) -> Path:
    return (root or shared_root()) / "data" / "openb"


def pod_file(trace: str, root: Path | None = None) -> Path:
    """`default` → openb_pod_list_default.csv, `gpushare40` → openb_pod_list_gpushare40.csv."""
    return openb_dir(root) / f"openb_pod_list_{trace}.csv"


def available_traces(root: Path | None = None) -> tuple[str, ...]:
    prefix = "openb_pod_list_"
    found = sorted(p.stem[len(prefix) :] for p in openb_dir(root).glob(f"{prefix}*.csv"))
    return tuple(sorted(found, key=lambda t: (t != "default", t)))


def load_nodes(path: Path) -> tuple[TraceNode, ...]:
    """GPU nodes in file order (the file is sorted by name, as the paper's simulator sorts them)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    nodes = tuple(
        TraceNode(
            name=row["sn"],
            cpu_milli=int(row["cpu_milli"]),
            memory_mib=int(row["memory_mib"]),
            gpu_count=int(row["gpu"]),
            model=row["model"],
        )
        for row in rows
    )
    return tuple(sorted(nodes, key=lambda n: n.name))


def load_pods(path: Path) -> tuple[TracePod, ...]:
    """Pods sorted by name. A missing `memory_mib` or `gpu_spec` column reads as 0 / any model."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    pods = []
    for row in rows:
        count = int(row["num_gpu"])
        milli = min(int(row["gpu_milli"]), MILLI_PER_GPU) if count > 0 else 0
        spec = row.get("gpu_spec") or ""
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row.get("memory_mib") or 0),
                gpu_count=count if milli > 0 else 0,
                gpu_milli=milli,
                gpu_models=tuple(part for part in spec.split("|") if part),
            )
        )
    return tuple(sorted(pods, key=lambda p: p.name))


def paper_workload(pods: tuple[TracePod, ...]) -> Workload:
    """The target workload M as the paper builds it: whole file, 95% of pods, CPU-only shapes in."""
    return typical_workload_from((p.shape for p in pods), popularity_threshold_percent=95.0)


@dataclass(frozen=True, slots=True)
class PaperResult:
    mean: float
    sd: float
    frag_rate_at_90: float | None = None  # cluster fragmentation rate (% of idle GPU), mean


#: Our policy names → the paper simulator's result directory names.
PAPER_POLICY_NAMES = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}


def load_paper_results(root: Path | None = None) -> dict[tuple[str, str, int], PaperResult]:
    """(trace, policy, arrival %) → unallocated GPU % (mean, sd over 10 seeds) from the paper's runs."""
    path = openb_dir(root) / PAPER_SUMMARY_FILE
    if not path.exists():
        return {}
    by_dir = {v: k for k, v in PAPER_POLICY_NAMES.items()}
    out: dict[tuple[str, str, int], PaperResult] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            trace = row["workload"].removeprefix("openb_pod_list_")
            policy = by_dir.get(row["sc_policy"])
            if policy is None:
                continue
            for arrival in (90, 95, 100, 110, 120, 130):
                mean = row.get(f"unalloc_pct_at_{arrival}_mean")
                sd = row.get(f"unalloc_pct_at_{arrival}_sd")
                frag = row.get("frag_rate_pct_at_90_mean")
                if mean and sd:
                    out[(trace, policy, arrival)] = PaperResult(
                        float(mean), float(sd), float(frag) if frag else None
                    )
    return out
