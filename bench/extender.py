"""`make bench-extender`: extender latency over loopback HTTP at fleet scale, memory and cold start.

For 1,000, 5,000 and 10,000 nodes of 8 GPUs with mixed load, a server process holds the
fleet; this process sends real-size filter and prioritize bodies (the Pod JSON the scheduler
sends plus the node-name list) and records latency percentiles, the server's resident memory
and its time from start to ready. Results go to the "Extender" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.report_file import replace_section

SIZES = (1000, 5000, 10000)


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


def measure(nodes: int, calls: int) -> dict[str, float]:
    port = _free_port()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.extender_server", "--nodes", str(nodes), "--port", str(port)]
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            while True:
                try:
                    if http.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("extender server exited early")
                time.sleep(0.05)
            cold = time.perf_counter() - started
            names = [f"gpu-{i:05d}" for i in range(nodes)]
            sample = names[: min(nodes, 5000)] if nodes <= 5000 else names[:: max(1, nodes // 5000)][:5000]
            filter_s, prio_s = [], []
            for i in range(calls):
                body = {"Pod": _pod(i), "Nodes": None, "NodeNames": sample}
                t0 = time.perf_counter()
                reply = http.post("/filter", json=body)
                filter_s.append(time.perf_counter() - t0)
                passed = reply.json()["NodeNames"]
                t0 = time.perf_counter()
                http.post("/prioritize", json={**body, "NodeNames": passed})
                prio_s.append(time.perf_counter() - t0)
            warm_filter, warm_prio = filter_s[4:], prio_s[4:]
            return {
                "nodes": nodes,
                "sent": len(sample),
                "filter_p50": _pct(warm_filter, 0.5),
                "filter_p99": _pct(warm_filter, 0.99),
                "prio_p50": _pct(warm_prio, 0.5),
                "prio_p99": _pct(warm_prio, 0.99),
                "first_filter_ms": filter_s[0] * 1000,
                "rss_mib": _rss_mib(proc.pid),
                "cold_start_s": cold,
            }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def render(rows: list[dict[str, float]], calls: int) -> str:
    lines = [
        "Filter and prioritize over loopback HTTP (uvicorn, one worker), real-size bodies: the Pod JSON",
        "the scheduler sends and up to 5,000 node names per call (the scheduler's sample); nodes have",
        "8 GPUs of five real machine shapes with mixed load. Warm-cache percentiles over "
        f"{calls - 4} calls of four request kinds (1, 2, 4 GPUs and a share) after 4 warm-up calls.",
        "",
        "| nodes | names per call | filter p50 ms | filter p99 ms | prioritize p50 ms | prioritize p99 ms | first filter ms (cold cache) | RSS MiB | start to ready s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['sent']:,} | {r['filter_p50']:.1f} | {r['filter_p99']:.1f} | {r['prio_p50']:.1f} | "
            f"{r['prio_p99']:.1f} | {r['first_filter_ms']:.0f} | {r['rss_mib']:.0f} | {r['cold_start_s']:.1f} |"
        )
    lines += [
        "",
        "Targets at 5,000 nodes: filter p99 ≤ 5 ms, prioritize p99 ≤ 10 ms; memory ≤ 500 MB at 10,000 nodes.",
        "",
        "Reproduce: `make bench-extender`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.extender")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--calls", type=int, default=104)
    parser.add_argument("--out", default=os.environ.get("LINKPACK_BENCH_FILE", "docs/BENCHMARKS.md"))
    args = parser.parse_args(argv)
    rows = [measure(int(n), args.calls) for n in args.sizes.split(",")]
    text = render(rows, args.calls)
    print(text)
    replace_section(Path(args.out), "Extender", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
