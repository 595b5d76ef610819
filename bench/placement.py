"""Whole-GPU placement benchmark: oracle agreement, besteffort comparison, latency.

`python -m bench.placement [--seed 7] [--states 160] [--no-write]` (also `make bench-placement`).

Every captured `nvidia-smi topo -m` matrix under the shared data folder that parses (found
through `topology.catalog`, models and memory from its profiles) plus the synthetic 16-GPU
DGX-2 is tried with many seeded random states (GPUs busy, unhealthy) and request sizes:

(a) agreement of `topology.placement.place` with the exhaustive `topology.oracle`, where the
    oracle's brute force stays affordable;
(b) the ring bottleneck of our set against go-gpuallocator's besteffort policy
    (`bench.gpuallocator_baseline`), and, for 1-GPU pods, what each leaves behind;
(c) wall time per `place` call, p50 / p99, by GPU count.

It rewrites the "## Placement" section of docs/BENCHMARKS.md and prints a summary.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from math import comb, factorial
from pathlib import Path

from bench.gpuallocator_baseline import besteffort_allocate, partition_count, scores_from_topology
from topology import catalog
from topology.gpu_sets import LinkTable, link_table, mask_of, members_of
from topology.model import NodeTopology
from topology.oracle import oracle_best_set
from topology.placement import place, whole_gpu_candidates
from topology.scheduling import GpuUsage, NodeState, Placement, WholeGpus
from topology.smi_parser import TopologyParseError, parse_topo_matrix

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "BENCHMARKS.md"
SECTION = "## Placement"
ORACLE_BUDGET = 200_000  # brute-force ring evaluations allowed per oracle call
BESTEFFORT_PARTITION_LIMIT = 20_000  # besteffort partitions allowed per call


@dataclass
class MachineResult:
    name: str
    gpus: int
    cases: int = 0
    oracle_checked: int = 0
    oracle_agreed: int = 0
    disagreements: list[str] = field(default_factory=list)
    baseline_compared: int = 0
    higher: int = 0
    equal: int = 0
    lower: int = 0
    baseline_failed: int = 0
    baseline_skipped: int = 0
    single_compared: int = 0
    single_better: int = 0
    single_equal: int = 0
    single_worse: int = 0
    times_ms: list[float] = field(default_factory=list)  # CPU time of the calling thread
    wall_ms: list[float] = field(default_factory=list)


def load_topologies() -> tuple[list[tuple[str, NodeTopology]], list[str]]:
    """Every catalog machine and every other parseable matrix, plus the synthetic DGX-2."""
    loaded: list[tuple[str, NodeTopology]] = []
    skipped: list[str] = []
    catalogued = {profile.file for profile in catalog.MACHINES.values()}
    for name in catalog.machine_names():
        try:
            loaded.append((name, catalog.load_machine(name)))
        except catalog.CatalogError as exc:
            skipped.append(f"{name}: {exc}")
    topo_dir = catalog.topo_dir()
    for path in sorted(topo_dir.glob("*.txt")):
        if path.name in catalogued:
            continue
        try:
            parsed = parse_topo_matrix(path.read_text(encoding="utf-8", errors="replace"))
        except TopologyParseError as exc:
            skipped.append(f"{path.name}: {exc}")
            continue
        loaded.append((path.stem, catalog.with_synthetic_ids(parsed.topology, path.stem)))
    return loaded, skipped


def random_state(topology: NodeTopology, rng: random.Random) -> NodeState:
    busy_share = rng.choice([0.0, 0.0, 0.15, 0.3, 0.45, 0.6, 0.75])
    usage = tuple(
        GpuUsage(whole=rng.random() < busy_share, healthy=rng.random() >= 0.03) for _ in topology.gpus
    )
    return NodeState("bench", topology, usage)


def oracle_cost(free: int, k: int) -> int:
    left = max(k, 2)
    ring = factorial(k - 1) if k > 1 else 1
    leftover = comb(free - k, left) * (factorial(left - 1) if left > 1 else 1)
    return comb(free, k) * (ring + leftover)


def run_machine(name: str, topology: NodeTopology, states: int, rng: random.Random) -> MachineResult:
    result = MachineResult(name, topology.gpu_count)
    table = link_table(topology)
    scores = scores_from_topology(topology)
    nic_names = [nic.name for nic in topology.nics]
    place(NodeState.empty("warm", topology), WholeGpus(1))  # build the per-topology table once
    for _ in range(states):
        node = random_state(topology, rng)
        free = whole_gpu_candidates(node)
        if not free:
            continue
        k = rng.randint(1, len(free))
        near = rng.choice(nic_names) if nic_names and rng.random() < 0.2 else None
        request = WholeGpus(k, near_nic=near)
        wall_started, cpu_started = time.perf_counter(), time.thread_time()
        outcome = place(node, request)
        result.times_ms.append((time.thread_time() - cpu_started) * 1000)
        result.wall_ms.append((time.perf_counter() - wall_started) * 1000)
        result.cases += 1
        assert isinstance(outcome, Placement), outcome
        if oracle_cost(len(free), k) <= ORACLE_BUDGET:
            expected = oracle_best_set(node, request)
            result.oracle_checked += 1
            if expected is not None and expected.gpus == outcome.gpus:
                result.oracle_agreed += 1
            else:
                result.disagreements.append(f"free={free} k={k} ours={outcome.gpus} oracle={expected}")
        if near is None:
            compare_with_besteffort(result, table, scores, free, k, outcome)
    return result


def compare_with_besteffort(
    result: MachineResult,
    table: LinkTable,
    scores: list[list[int]],
    free: tuple[int, ...],
    k: int,
    ours: Placement,
) -> None:
    if partition_count(len(free), k) > BESTEFFORT_PARTITION_LIMIT:
        result.baseline_skipped += 1
        return
    theirs = besteffort_allocate(scores, list(free), [], k)
    result.baseline_compared += 1
    if len(theirs) != k or any(d is None for d in theirs):
        result.baseline_failed += 1
        result.higher += 1
        return
    chosen = [d for d in theirs if d is not None]
    our_ring = table.ring_bottleneck(mask_of(ours.gpus))
    their_ring = table.ring_bottleneck(mask_of(chosen))
    if our_ring > their_ring:
        result.higher += 1
    elif our_ring == their_ring:
        result.equal += 1
    else:
        result.lower += 1
    if k == 1 and len(free) > 2:
        result.single_compared += 1
        ours_left = leftover_quality(table, free, ours.gpus)
        theirs_left = leftover_quality(table, free, chosen)
        if ours_left > theirs_left:
            result.single_better += 1
        elif ours_left == theirs_left:
            result.single_equal += 1
        else:
            result.single_worse += 1


def leftover_quality(
    table: LinkTable, free: tuple[int, ...], taken: list[int] | tuple[int, ...]
) -> tuple[int, int]:
    """Best pair the remaining free GPUs can form, then how well each can still pair."""
    leftover = mask_of(free) & ~mask_of(taken)
    return table.best_ring_within(leftover, 2), table.leftover_pairs(members_of(leftover))


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def render(results: list[MachineResult], skipped: list[str], seed: int, states: int, elapsed: float) -> str:
    def total(attr: str) -> int:
        return sum(int(getattr(r, attr)) for r in results)

    lines = [
        SECTION,
        "",
        f"Reproduce with `make bench-placement` (= `python -m bench.placement --seed {seed} --states {states}`).",
        f"{len(results)} topologies (every parseable capture in the shared `data/topo` folder plus the synthetic "
        f"16-GPU DGX-2), {states} seeded random states each (GPUs busy with probability 0-0.75, 3% unhealthy), "
        f"request size uniform over 1..free GPUs, 20% of requests on NIC boxes ask for a random NIC. "
        f"Run took {elapsed:.0f} s.",
        "",
        "### (a) Agreement with the exhaustive oracle",
        "",
        f"Checked where the brute force stays under {ORACLE_BUDGET:,} ring evaluations per case.",
        "",
        f"**{total('oracle_agreed')} / {total('oracle_checked')} cases agree** "
        f"({100 * total('oracle_agreed') / max(1, total('oracle_checked')):.1f}%).",
        "",
        "### (b) Ring bottleneck against go-gpuallocator besteffort",
        "",
        "Besteffort is a port of topology.md §1.2-1.4 fed GPUs in index order; NVLinked pairs get their PCIe "
        "level from NUMA (same NUMA -> NODE, else SYS) and NVSwitch hides NVLink from it, as in the original. "
        "Requests with a NIC preference are left out (besteffort has no NIC term). Cases where besteffort would "
        f"walk more than {BESTEFFORT_PARTITION_LIMIT:,} partitions are skipped (16-GPU requests of 2-7 GPUs: "
        "up to 2.6 M partitions). A padded (short) besteffort answer counts as ours higher.",
        "",
        "| topology | GPUs | cases | compared | ours higher | equal | ours lower | besteffort short | skipped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.gpus < 2:
            continue
        lines.append(
            f"| {r.name} | {r.gpus} | {r.cases} | {r.baseline_compared} | {r.higher} | {r.equal} | {r.lower} "
            f"| {r.baseline_failed} | {r.baseline_skipped} |"
        )
    compared = max(1, total("baseline_compared"))
    lines += [
        f"| **all** | | {total('cases')} | {total('baseline_compared')} | {total('higher')} "
        f"({100 * total('higher') / compared:.1f}%) | {total('equal')} ({100 * total('equal') / compared:.1f}%) "
        f"| {total('lower')} ({100 * total('lower') / compared:.1f}%) | {total('baseline_failed')} "
        f"| {total('baseline_skipped')} |",
        "",
        "Ours can never be lower: the search maximises the ring bottleneck over every free set first "
        "(confirmed by (a)); besteffort sums pair scores over a whole partition, so on NVSwitch boards and "
        "mixed NVLink meshes it may pick a set whose slowest ring hop is slower.",
        "",
        "1-GPU pods (besteffort takes the first free GPU): what the remaining free GPUs can still form "
        "(best pair, then how well every GPU can still pair) — "
        f"ours better in {total('single_better')}, equal in {total('single_equal')}, "
        f"worse in {total('single_worse')} of {total('single_compared')} cases.",
        "",
        "### (c) Time per placement",
        "",
        "CPU time of one `place()` call (`time.thread_time`, so time the OS gives other processes on a shared "
        "machine is not counted; wall-clock p99 alongside). Per-topology tables are built by one untimed "
        "warm-up call; the states are fresh, so per-state memo tables start cold.",
        "",
        "| GPUs per node | calls | p50 ms | p99 ms | max ms | wall p50 ms | wall p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_size: dict[int, list[float]] = defaultdict(list)
    wall_by_size: dict[int, list[float]] = defaultdict(list)
    for r in results:
        by_size[r.gpus].extend(r.times_ms)
        wall_by_size[r.gpus].extend(r.wall_ms)
    for size in sorted(by_size):
        times, wall = by_size[size], wall_by_size[size]
        lines.append(
            f"| {size} | {len(times)} | {statistics.median(times):.3f} | {percentile(times, 0.99):.3f} "
            f"| {max(times):.3f} | {statistics.median(wall):.3f} | {percentile(wall, 0.99):.3f} |"
        )
    if skipped:
        lines += ["", "Captures that do not parse (left out):", ""]
        lines += [f"- {entry}" for entry in skipped]
    return "\n".join(lines) + "\n"


def write_section(section: str, path: Path = DOC) -> None:
    """Replace the "## Placement" section of the document (create it when missing)."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is None:
        body = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        rest = "".join(lines[end:])
        body = "".join(lines[:start]) + section + ("\n" + rest if rest else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--states", type=int, default=160, help="random states per topology")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    topologies, skipped = load_topologies()
    if not topologies:
        print(f"no topologies found under {catalog.topo_dir()}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    results = [run_machine(name, topology, args.states, rng) for name, topology in topologies]
    section = render(results, skipped, args.seed, args.states, time.perf_counter() - started)
    print(section)
    for r in results:
        for line in r.disagreements[:5]:
            print(f"DISAGREEMENT {r.name}: {line}", file=sys.stderr)
    if not args.no_write:
        write_section(section)
        print(f"wrote the Placement section of {DOC.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
