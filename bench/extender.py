"""`make bench-extender`: extender latency over loopback HTTP at fleet scale, memory and cold start.

For each fleet size (8-GPU nodes of five real machine shapes with mixed load) this writes the
fleet once as the API server would list it (Node, GpuTopology and ledger ConfigMap objects),
then starts `bench/extender_server.py` on it, which decodes and loads every object the way the
extender's watches do. Measured per run: start to ready (process start until the extender
reports ready), the first filter and the first prioritize after ready (cold caches), warm
percentiles of real-size filter and prioritize calls (the Pod JSON the scheduler sends plus up
to 5,000 node names), and the server's resident memory.

With `--baseline-rev REV` every round also runs the extender of that git revision on the same
fleet, one after the other, so old and new are compared side by side on a shared machine; the
table then reports new/old ratios per round. Results go to the "Extender" section of
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.report_file import replace_section

SIZES = (1000, 5000, 10000)
MACHINES = ("hgx-h100", "dgx-a100", "dgx1-v100", "pcie-nv12-pairs", "rtx3090-2socket")
SERVER = Path(__file__).with_name("extender_server.py")
REPO_ROOT = Path(__file__).resolve().parent.parent
METRICS = (
    "cold_start_s",
    "first_filter_ms",
    "first_prio_ms",
    "filter_p50",
    "filter_p99",
    "prio_p50",
    "prio_p99",
    "rss_mib",
)


def _pod(i: int) -> dict:
    kinds = (
        {"nvidia.com/gpu": "1"},
        {"nvidia.com/gpu": "2"},
        {"nvidia.com/gpu": "4"},
        {"nvidia.com/gpu.shared": "25", "nvidia.com/gpu.memory": "8192"},
    )
    limits = kinds[i % len(kinds)]
    return {
        "metadata": {
            "name": f"bench-{i}",
            "namespace": "bench",
            "uid": f"0000-{i}",
            "labels": {"app": "bench"},
            "annotations": {},
        },
        "spec": {
            "schedulerName": "linkpack",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/ml/trainer:1.0",
                    "command": ["python", "train.py"],
                    "resources": {
                        "limits": {"cpu": "8", "memory": "32Gi", **limits},
                        "requests": {"cpu": "8", "memory": "32Gi", **limits},
                    },
                }
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {"phase": "Pending"},
    }


def write_fleet(nodes: int, path: Path, seed: int = 1) -> None:
    """The fleet's API objects: per node a Node, its GpuTopology and, under load, its ledger."""
    from contract.allocation import Allocation
    from contract.gpu_topology import as_published, encode_status, topology_object
    from contract.keys import DEFAULT_NAMESPACE, LEDGER_LABEL, ledger_name
    from contract.ledger import Ledger, LedgerEntry, encode_ledger
    from topology.accounting import with_grants
    from topology.catalog import load_machine
    from topology.placement import place
    from topology.scheduling import DEFAULT_UNITS_PER_GPU, GpuShare, NodeState, Placement, WholeGpus

    rng = random.Random(seed)
    bases = {m: load_machine(m) for m in MACHINES}
    fleet: dict[str, list[dict[str, Any]]] = {"nodes": [], "topologies": [], "ledgers": []}
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        base = bases[MACHINES[i % len(MACHINES)]]
        topology = replace(base, gpus=tuple(replace(g, uuid=f"GPU-{name}-{g.index}") for g in base.gpus))
        state = NodeState.empty(name, topology, DEFAULT_UNITS_PER_GPU)
        entries = []
        for k in range(rng.randint(0, 5)):  # mixed load: some whole GPUs, some shares
            request = (
                WholeGpus(rng.choice((1, 1, 2)))
                if rng.random() < 0.6
                else GpuShare(units=25, memory_mib=8192)
            )
            outcome = place(state, request)
            if not isinstance(outcome, Placement):
                break
            state = with_grants(state, outcome.grants)
            entries.append(
                LedgerEntry(f"{name}-load-{k}", "load", f"{name}-{k}", Allocation(name, outcome.grants), 0.0)
            )
        fleet["nodes"].append(
            {
                "metadata": {"name": name, "annotations": {}},
                "status": {"allocatable": {"nvidia.com/gpu": str(topology.gpu_count)}},
            }
        )
        record = topology_object(name, topology)
        record["status"] = encode_status(as_published(name, topology).status, with_heartbeat=False)
        fleet["topologies"].append(record)
        if entries:
            fleet["ledgers"].append(
                {
                    "metadata": {
                        "name": ledger_name(name),
                        "namespace": DEFAULT_NAMESPACE,
                        "labels": {LEDGER_LABEL: "true"},
                    },
                    "data": encode_ledger(Ledger(name, tuple(entries))),
                }
            )
    path.write_text(json.dumps(fleet))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[float, bytes]:
    """(seconds from sending the request to having read the whole answer, the answer)."""
    t0 = time.perf_counter()
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    data = reply.read()
    elapsed = time.perf_counter() - t0
    if reply.status != 200:
        raise RuntimeError(f"{path}: HTTP {reply.status}: {data[:300]!r}")
    return elapsed, data


def measure(fleet: Path, nodes: int, calls: int, source: Path) -> dict[str, float]:
    """One run of the extender in checkout `source` over the fleet file."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(source)}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-P", str(SERVER), "--fleet", str(fleet), "--port", str(port)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=source,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("extender server exited before it was ready")
        cold = time.perf_counter() - started
        names = [f"gpu-{i:05d}" for i in range(nodes)]
        sample = names if nodes <= 5000 else names[:: max(1, nodes // 5000)][:5000]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
        filter_s, prio_s = [], []
        for i in range(calls):
            pod = _pod(i)
            spent, answer = _post(
                conn, "/filter", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": sample}).encode()
            )
            filter_s.append(spent)
            passed = json.loads(answer)["NodeNames"]
            spent, _ = _post(
                conn, "/prioritize", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode()
            )
            prio_s.append(spent)
        conn.close()
        warm_filter, warm_prio = filter_s[4:], prio_s[4:]
        return {
            "nodes": nodes,
            "sent": len(sample),
            "filter_p50": _pct(warm_filter, 0.5),
            "filter_p99": _pct(warm_filter, 0.99),
            "prio_p50": _pct(warm_prio, 0.5),
            "prio_p99": _pct(warm_prio, 0.99),
            "first_filter_ms": filter_s[0] * 1000,
            "first_prio_ms": prio_s[0] * 1000,
            "rss_mib": _rss_mib(proc.pid),
            "cold_start_s": cold,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _cell(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def render(
    results: dict[int, dict[str, list[dict[str, float]]]], calls: int, baseline: str, current: str = ""
) -> str:
    rounds = max(len(v["new"]) for v in results.values())
    lines = [
        "Filter and prioritize over loopback HTTP (plain, one connection kept alive), real-size bodies: "
        "the Pod JSON the scheduler sends and up to 5,000 node names per call (the scheduler's sample); "
        "nodes have 8 GPUs of five real machine shapes with mixed load. The fleet is handed to the "
        "extender as the API server lists it (Node, GpuTopology and ledger ConfigMap JSON), decoded as "
        f"the watches decode it. Warm percentiles over {calls - 4} calls of four request kinds (1, 2, 4 "
        'GPUs and a share) after 4 warm-up calls; "first" is the first call after the extender reports '
        f"ready. {rounds} runs per row; median (min-max).",
        "",
        "| nodes | code | start to ready s | first filter ms | first prioritize ms | filter p50 ms | filter p99 ms | prioritize p50 ms | prioritize p99 ms | RSS MiB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    digits = {"cold_start_s": 1, "first_filter_ms": 0, "first_prio_ms": 0, "rss_mib": 0}
    for nodes, by_code in results.items():
        for code, runs in by_code.items():
            label = f"at {current}" if code == "new" and current else "this revision"
            if code == "old":
                label = f"at {baseline}"
            cells = [_cell([r[m] for r in runs], digits.get(m, 1)) for m in METRICS]
            lines.append(f"| {nodes:,} | {label} | " + " | ".join(cells) + " |")
        if "old" in by_code:
            ratios = []
            for m in METRICS:
                per_round = [n[m] / o[m] for n, o in zip(by_code["new"], by_code["old"], strict=False)]
                ratios.append(f"{statistics.median(per_round):.2f}")
            lines.append(f"| {nodes:,} | ratio new/old (median of rounds) | " + " | ".join(ratios) + " |")
    lines += [
        "",
        "Targets at 5,000 nodes: filter p50 under 5 ms and prioritize p50 under 10 ms; the first "
        "filter after ready well within the scheduler's 5 s httpTimeout; at 10,000 nodes start to "
        "ready within 5 s and under 500 MB.",
        "",
        "Reproduce: `make bench-extender` (this part: `python -m bench.extender`; `--sizes`, "
        "`--rounds`, `--baseline-rev REV` to run an earlier revision side by side).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.extender")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--calls", type=int, default=104)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-rev", help="also run the extender of this git revision, side by side")
    parser.add_argument(
        "--rev", help="run 'this revision' from this git revision (default: the working tree)"
    )
    parser.add_argument("--out", default=os.environ.get("LINKPACK_BENCH_FILE", "docs/BENCHMARKS.md"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    from bench.scheduler_throughput import checkout

    results: dict[int, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="linkpack-fleet-") as tmp, contextlib.ExitStack() as stack:
        old = stack.enter_context(checkout(args.baseline_rev)) if args.baseline_rev else None
        new = stack.enter_context(checkout(args.rev)) if args.rev else REPO_ROOT
        for size in (int(n) for n in args.sizes.split(",")):
            fleet = Path(tmp) / f"fleet-{size}.json"
            write_fleet(size, fleet)
            results[size] = {"new": []} | ({"old": []} if old else {})
            for round_no in range(args.rounds):
                for code, source in (("new", new), ("old", old)):
                    if source is None:
                        continue
                    row = measure(fleet, size, args.calls, source)
                    results[size][code].append(row)
                    print(f"{size} round {round_no + 1} {code}: " + json.dumps(row), flush=True)
    text = render(results, args.calls, args.baseline_rev or "", args.rev or "")
    print(text)
    if not args.no_write:
        replace_section(Path(args.out), "Extender", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
