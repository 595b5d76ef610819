"""`python -m bench.cluster`: the FGD-paper cluster packing benchmark (see bench/cluster/__init__.py).

Examples:
    python -m bench.cluster                               # what docs/BENCHMARKS.md shows (all traces: long)
    python -m bench.cluster --quick --traces default      # seeds 42-43 only: a smoke test
    python -m bench.cluster --traces default,gpushare40,multigpu50 --seeds 42-51 --policies all
    python -m bench.cluster --policies fgd,ours --seeds 42,45 --no-write
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from bench.cluster.policy import PolicyFactory
from bench.cluster.protocol import RunRecord
from bench.cluster.registry import parse_policies
from bench.cluster.report import PolicySummary, markdown_section, summarise, write_plot, write_section
from bench.cluster.simulate import RunSpec, simulate
from bench.cluster.topologies import wiring_name
from bench.cluster.trace import (
    NODE_FILE,
    REPO_ROOT,
    TraceNode,
    TracePod,
    available_traces,
    load_nodes,
    load_paper_results,
    load_pods,
    openb_dir,
    paper_workload,
    pod_file,
)
from topology.fragmentation import Workload

#: Traces run by default: `default` and every gpushare* and multigpu* pod list found.
TRACE_FAMILIES = ("gpushare", "multigpu")


def default_traces() -> tuple[str, ...]:
    found = available_traces()
    families = [t for t in found if t.startswith(TRACE_FAMILIES)]
    ordered = sorted(
        families, key=lambda t: (t.rstrip("0123456789"), int(t.lstrip("abcdefghijklmnopqrstuvwxyz") or 0))
    )
    return ("default", *ordered)


DEFAULT_POLICIES = "all,fgd-ideal"
QUICK_SEEDS = (42, 43)
BENCHMARKS_MD = REPO_ROOT / "docs" / "BENCHMARKS.md"
PLOT_PATH = REPO_ROOT / "docs" / "img" / "cluster-packing-default.png"


def parse_seeds(text: str) -> tuple[int, ...]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(seeds)


# ----------------------------------------------------------------------------- worker side

_NODES: tuple[TraceNode, ...] | None = None
_TRACES: dict[str, tuple[tuple[TracePod, ...], Workload]] = {}
_FACTORIES: dict[str, PolicyFactory] = {}


def run_one(spec: RunSpec) -> RunRecord:
    """One run; traces and policy factories (with their memos) are kept per worker process."""
    global _NODES
    from bench.cluster.registry import POLICIES

    if _NODES is None:
        _NODES = load_nodes(openb_dir() / NODE_FILE)
    if spec.trace not in _TRACES:
        pods = load_pods(pod_file(spec.trace))
        _TRACES[spec.trace] = (pods, paper_workload(pods))
    if spec.policy not in _FACTORIES:
        _FACTORIES[spec.policy] = POLICIES[spec.policy]()
    pods, workload = _TRACES[spec.trace]
    return simulate(spec, _NODES, pods, workload, _FACTORIES[spec.policy])


# ----------------------------------------------------------------------------- driver


def run_all(specs: Sequence[RunSpec], jobs: int) -> list[RunRecord]:
    started = time.perf_counter()
    records: list[RunRecord] = []

    def note(record: RunRecord) -> None:
        records.append(record)
        print(
            f"[{time.perf_counter() - started:7.1f}s] {record.trace:12s} {record.policy:10s} "
            f"seed {record.seed}: {record.seconds:6.1f}s, {record.failed} failed",
            file=sys.stderr,
            flush=True,
        )

    if jobs <= 1:
        for spec in specs:
            note(run_one(spec))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for record in pool.map(run_one, specs):
                note(record)
    return records


def versus_fgd(by_trace: dict[str, list[PolicySummary]]) -> list[str]:
    """One line per trace: ours against FGD at 100% arrival, and the multi-GPU link quality."""
    lines = []
    for trace, summaries in by_trace.items():
        found = {s.policy: s for s in summaries}
        if "fgd" not in found:
            continue
        fgd = found["fgd"]
        for name in ("ours", "ours-kube-cpu"):
            if name not in found:
                continue
            mine = found[name]
            gap = mine.at(100).mean - fgd.at(100).mean
            verdict = "fewer" if gap < 0 else "more"
            lines.append(
                f"`{trace}`: {name} {mine.at(100)} vs FGD {fgd.at(100)} % unallocated at 100% arrival, "
                f"{abs(gap):.2f} points ({abs(gap) * 62.12:.0f} GPUs) {verdict} for {name}; multi-GPU pods on "
                f"their node's best ring / mean GB/s: {name} {mine.link_text()}, FGD {fgd.link_text()}."
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--traces",
        default=None,
        help="comma-separated pod lists (default: default and every gpushare*/multigpu* list found)",
    )
    parser.add_argument("--seeds", default=None, help="e.g. 42-51 or 42,45 (default: 42-51)")
    parser.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help=f"comma-separated names, 'all' = the six baselines and ours (default: {DEFAULT_POLICIES})",
    )
    parser.add_argument("--quick", action="store_true", help="seeds 42-43 only, docs left alone (smoke test)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave docs alone")
    args = parser.parse_args(argv)
    write_docs = not (args.no_write or args.quick)

    seeds = QUICK_SEEDS if args.quick and args.seeds is None else parse_seeds(args.seeds or "42-51")
    traces = (
        tuple(t.strip() for t in args.traces.split(",") if t.strip()) if args.traces else default_traces()
    )
    policies = parse_policies(args.policies)
    for trace in traces:
        if not pod_file(trace).exists():
            parser.error(f"no pod list for trace {trace!r} at {pod_file(trace)}")
    # the longest runs first, so the pool's workers finish together
    weight = {"ours-kube-cpu": 0, "ours": 0, "fgd-ideal": 1, "fgd": 2}
    specs = sorted(
        (RunSpec(t, p, s) for t in traces for p in policies for s in seeds),
        key=lambda r: (weight.get(r.policy, 9), r.trace, r.seed),
    )
    started = time.perf_counter()
    records = run_all(specs, max(1, args.jobs))
    wall = time.perf_counter() - started

    by_trace: dict[str, list[PolicySummary]] = {}
    for trace in traces:
        for policy in policies:
            group = [r for r in records if r.trace == trace and r.policy == policy]
            by_trace.setdefault(trace, []).append(summarise(group))
    cpu_seconds = sum(r.seconds for r in records)
    notes = [
        f"{len(records)} runs in {wall:.0f} s wall ({cpu_seconds:.0f} CPU s in runs, {args.jobs} workers).",
        *versus_fgd(by_trace),
        '"ours" is the extender\'s default policy, which decides the node (`decideNode`), run through '
        "the same functions the extender calls (bench/cluster/ours.py): every arriving pod is shown to a "
        "`topology.workload_learning.WorkloadLearner` (the extender's pod watch does the same), filter is "
        "`topology.placement.place` with the learned workload, and the node is the first by "
        "`topology.node_choice` over `topology.scoring.node_terms` given each node's free CPU and memory "
        "before and after the pod and its CPU capacity (the extender has them from its node and pod "
        "watches): FGD's fragmentation delta against the learned workload in steps of 80 milli-GPU, then "
        "how much the pod moves the node's CPU and GPUs apart in 3 bands (5 for multi-GPU pods), then how "
        "far its free CPU falls short of its free GPUs after the pod in 5 bands, then (multi-GPU pods) the "
        "ring bottleneck, "
        "then a fixed order of node names (CRC-32). Topologies are assumed "
        f"(`bench/cluster/topologies.py`: 8xG2/V100 → {wiring_name('G2', 8)}, 8xG3 → "
        f"{wiring_name('G3', 8)}, 2xT4 → {wiring_name('T4', 2)}).",
        "CPU-only pods never reach the extender (the scheduler calls it only for pods asking for GPU "
        "resources); here they go to the first feasible node in the same name order. Where kube-scheduler "
        "spreads them instead (its default LeastAllocated scoring, `--policies ours-kube-cpu`), GPU nodes "
        "lose CPU everywhere and ours leaves about 6.5% unallocated on `default` (seed 42, prototype); keep CPU-only "
        "pods off GPU nodes (taints) to get the numbers above (a MostAllocated scoring profile for them is "
        "worse still: 10.1% in the prototype).",
        "What made the difference, measured on `default` (seeds 42-43, the policy prototyped on the "
        "simulator's arrays): ranking by the exact fragmentation delta leaves 7.4% unallocated, in steps "
        "of 40 / 80 / 150 milli-GPU 4.9 / 4.8 / 5.0%, and CPU/GPU balance bands after the step bring "
        "it to 4.6% (ranked by the balance after the pod, which spread GPU pods asking for little CPU "
        "through the real scheduler; by the pod's change of it, seeds 42-45: 4.92%); finer balance "
        "bands (20) go back to 5.6%, best-fit tie-breaks to 7.8%. Coarse steps "
        "work because equal nodes are then filled in a fixed order (first fit), which FGD's integer "
        "sigmoid score also gets from its ties.",
        "Multi-GPU column: over all placed 2/4/8-GPU pods of the runs, the share whose GPU set reaches "
        "the best ring bottleneck the chosen node's free GPUs allowed, and the mean ring bottleneck "
        "(GB/s, `topology.bandwidth` rates on the assumed wiring). FGD takes the lowest-index free GPUs.",
        "FGD is the paper's plugin, integer sigmoid score included; `fgd-ideal` (opt-in) ranks by the raw "
        "fragmentation delta instead.",
    ]
    plot_rel = None
    if "default" in by_trace and write_docs:
        write_plot(by_trace["default"], PLOT_PATH, "default")
        plot_rel = PLOT_PATH.relative_to(BENCHMARKS_MD.parent).as_posix()
    section = markdown_section(by_trace, load_paper_results(), plot_rel, notes)
    if not write_docs:
        print(section)
    else:
        write_section(BENCHMARKS_MD, section)
        print(section)
        print(f"wrote {BENCHMARKS_MD.relative_to(REPO_ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
