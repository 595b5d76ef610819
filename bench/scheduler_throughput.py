"""Pods per second through the real kube-scheduler: no extender, the protocol's floor, and ours.

One control plane (etcd + kube-apiserver + kube-scheduler built from the pinned Kubernetes
release) with a few hundred fake 8-GPU nodes. For each setup the same number of 1-GPU pods is
created before the scheduler starts, and the time until all are bound gives pods/s. The
scheduler's client rate limit is lifted (qps/burst 5000) in every row, so the API client is
never what limits a row. Rows:

- no extender: the scheduler alone;
- floor: `bench.floor_extender`, the cheapest extender that speaks the protocol (standard
  library, keep-alive, filter keeps all, prioritize 0, bind posts the Binding), over mutual
  TLS like ours and, for reference, over plain HTTP;
- ours: `python -m extender` with the shipped scheduler configuration (mutual TLS);
- ours at `--baseline-rev REV`: the same, from that git revision (to measure a change side by side).

Every row runs once per round, the rounds interleave the rows, and the table gives the median
and the spread over the rounds. Our extender is started fresh (and its ledgers deleted) per row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from contract.keys import LEDGER_LABEL
from tests.cluster.binaries import ensure_binaries
from tests.cluster.controlplane import (
    MANIFESTS,
    REPO_ROOT,
    ControlPlane,
    free_port,
    load_manifest,
    wait_for_crd,
)
from tests.cluster.linkpack_env import extender_tls, node_topology, publish_node, scheduler_config
from tests.tls_certs import TlsSet

PLAIN_CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: linkpack
    percentageOfNodesToScore: 100
"""
CLIENT_QPS = 5000
PROFILE_DIR: Path | None = None  # --profile: py-spy samples (threads holding the GIL) of our extender
NAMESPACE = "bench"


def lifted(config: str) -> str:
    """The scheduler configuration with its API client rate limit lifted and leader election off."""
    if "clientConnection:\n" not in config:
        raise ValueError("scheduler configuration has no clientConnection block")
    config = config.replace(
        "clientConnection:\n", f"clientConnection:\n  qps: {CLIENT_QPS}\n  burst: {CLIENT_QPS}\n", 1
    )
    return config.replace("leaderElect: true", "leaderElect: false")


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, verify: ssl.SSLContext | bool) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2, verify=verify).status_code == 200:
                return
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"{log.name}: not ready: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _client_context(tls: TlsSet) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tls.server_ca))
    context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    return context


@contextlib.contextmanager
def floor_extender(cp: ControlPlane, tls: TlsSet | None) -> Iterator[tuple[str, int]]:
    port = free_port()
    log = cp.log_dir / ("floor-tls.log" if tls else "floor-plain.log")
    args = [sys.executable, "-m", "bench.floor_extender", "--kubeconfig", str(cp.kubeconfig_path)]
    args += ["--port", str(port)]
    if tls is not None:
        args += ["--tls-cert", str(tls.server_cert), "--tls-key", str(tls.server_key)]
        args += ["--client-ca", str(tls.client_ca)]
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        _wait_ready(f"{url}/readyz", proc, log, _client_context(tls) if tls else False)
        yield url, proc.pid
    finally:
        _stop(proc)


@contextlib.contextmanager
def our_extender(cp: ControlPlane, tls: TlsSet, source: Path, name: str) -> Iterator[tuple[str, int]]:
    """`python -m extender` from `source` (a checkout), fresh, with no ledgers left from earlier rows."""
    core = client.CoreV1Api(cp.api_client())
    core.delete_collection_namespaced_config_map("linkpack-system", label_selector=f"{LEDGER_LABEL}=true")
    port, debug_port, ops_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(source),
        "LINKPACK_NAMESPACE": "linkpack-system",
        "LINKPACK_TLS_CERT_FILE": str(tls.server_cert),
        "LINKPACK_TLS_KEY_FILE": str(tls.server_key),
        "LINKPACK_CLIENT_CA_FILE": str(tls.client_ca),
    }
    args = [sys.executable, "-m", "extender", "--kubeconfig", str(cp.kubeconfig_path), "--host", "127.0.0.1"]
    args += ["--port", str(port), "--debug-port", str(debug_port), "--ops-port", str(ops_port)]
    args += ["--log-level", "warning"]
    log = cp.log_dir / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=source, env=env)
    try:
        _wait_ready(f"http://127.0.0.1:{ops_port}/readyz", proc, log, False)
        _PROFILED[proc.pid] = name
        yield f"https://127.0.0.1:{port}", proc.pid
    finally:
        _PROFILED.pop(proc.pid, None)
        _stop(proc)


_PROFILED: dict[int, str] = {}  # our extenders' pids and row names, for --profile


@contextlib.contextmanager
def profiled(pid: int) -> Iterator[None]:
    """With --profile: py-spy samples of the threads of our extender `pid` that hold the
    interpreter, from the scheduler's start until the last pod is bound (the measured window)."""
    name = _PROFILED.get(pid)
    if PROFILE_DIR is None or name is None:
        yield
        return
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    out = PROFILE_DIR / f"{name}-{time.strftime('%H%M%S')}.txt"
    spy = subprocess.Popen(
        ["py-spy", "record", "--gil", "-p", str(pid), "-f", "raw", "-r", "250", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # py-spy attaches
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Measured = tuple[float, int, float, float]


def _run(cp: ControlPlane, config: str, pods: int, extender_pid: int = 0, standby_pid: int = 0) -> Measured:
    """(pods/s until all are bound, nodes left with no pod at all, extender CPU ms per pod, CPU ms
    per pod of a second replica that only follows the cluster: the scheduler never calls it)."""
    core = client.CoreV1Api(cp.api_client())
    for i in range(pods):
        core.create_namespaced_pod(
            NAMESPACE,
            {
                "metadata": {"name": f"p-{i:05d}"},
                "spec": {
                    "schedulerName": "linkpack",
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.invalid/x",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        )
    listed = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)
    try:
        with profiled(extender_pid):
            cpu_before = cpu_seconds(extender_pid) if extender_pid else 0.0
            standby_before = cpu_seconds(standby_pid) if standby_pid else 0.0
            started = time.perf_counter()
            cp.start_scheduler(lifted(config))
            placed = _wait_bound(core, listed, pods, started + 900)
            rate = pods / (time.perf_counter() - started)
            cpu_ms = (cpu_seconds(extender_pid) - cpu_before) * 1000 / pods if extender_pid else 0.0
            standby_ms = (cpu_seconds(standby_pid) - standby_before) * 1000 / pods if standby_pid else 0.0
        nodes = {
            n["metadata"]["name"] for n in json.loads(core.list_node(_preload_content=False).data)["items"]
        }
        return rate, len(nodes - set(placed)), cpu_ms, standby_ms
    finally:
        cp.stop_scheduler()
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        while core.list_namespaced_pod(NAMESPACE).items:
            time.sleep(0.2)


def _wait_bound(core: client.CoreV1Api, listed: dict, pods: int, deadline: float) -> list[str]:
    """The node of every pod once all `pods` are bound, from a watch that starts at the list
    taken before the scheduler started. A watch costs the API server one event per change, where
    listing every pod over and over would take CPU from the components being measured."""
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in listed["items"]}
    version = listed["metadata"]["resourceVersion"]
    while sum(1 for n in nodes.values() if n) < pods:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise RuntimeError(f"only {sum(1 for n in nodes.values() if n)}/{pods} bound in time")
        stream: Any = core.list_namespaced_pod(
            NAMESPACE,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=max(1, int(left)),
            _preload_content=False,
        )
        bound = sum(1 for n in nodes.values() if n)
        try:
            for line in stream:
                event = json.loads(line)
                pod = event["object"]
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watching the pods: {pod.get('message')}")
                version = pod["metadata"]["resourceVersion"]
                if event["type"] not in ("ADDED", "MODIFIED"):
                    continue
                name, node = pod["metadata"]["name"], pod["spec"].get("nodeName") or ""
                bound += bool(node) - bool(nodes.get(name))
                nodes[name] = node
                if bound >= pods:
                    break
        finally:
            stream.release_conn()
    return list(nodes.values())


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    run: Callable[[ControlPlane, int], Measured]


def _rows(tls: TlsSet, baseline: Path | None, plain_floor: bool, ours_source: Path) -> list[Row]:
    def none(cp: ControlPlane, pods: int) -> Measured:
        return _run(cp, PLAIN_CONFIG.format(kubeconfig=cp.kubeconfig_path), pods)

    def floor(use_tls: bool) -> Callable[[ControlPlane, int], Measured]:
        def run(cp: ControlPlane, pods: int) -> Measured:
            with floor_extender(cp, tls if use_tls else None) as (url, pid):
                return _run(cp, scheduler_config(cp, url, tls if use_tls else None), pods, pid)

        return run

    def ours(source: Path, name: str) -> Callable[[ControlPlane, int], Measured]:
        def run(cp: ControlPlane, pods: int) -> Measured:
            with our_extender(cp, tls, source, name) as (url, pid):
                return _run(cp, scheduler_config(cp, url, tls), pods, pid)

        return run

    def two_replicas(cp: ControlPlane, pods: int) -> Measured:
        with (
            our_extender(cp, tls, ours_source, "ours") as (url, pid),
            our_extender(cp, tls, ours_source, "ours-standby") as (_, standby),
        ):
            return _run(cp, scheduler_config(cp, url, tls), pods, pid, standby)

    rows = [
        Row("none", "no extender", none),
        Row(
            "floor",
            "floor extender, mutual TLS (stdlib, filter keeps all, prioritize 0, bind posts the Binding)",
            floor(True),
        ),
    ]
    if plain_floor:
        rows.append(Row("floor_plain", "floor extender, plain HTTP", floor(False)))
    rows.append(
        Row("ours", "Linkpack extender, shipped configuration (mutual TLS)", ours(ours_source, "ours"))
    )
    rows.append(
        Row(
            "replicas",
            "Linkpack extender, two replicas (the scheduler calls the first; the second follows the "
            "cluster, as every replica does)",
            two_replicas,
        )
    )
    if baseline is not None:
        rows.append(Row("baseline", f"Linkpack extender at {baseline.name}", ours(baseline, "ours-baseline")))
    return rows


def measure(
    nodes: int,
    pods: int,
    rounds: int,
    baseline: Path | None = None,
    plain_floor: bool = True,
    only: frozenset[str] | None = None,
    ours_source: Path = REPO_ROOT,
) -> dict[str, object]:
    with ControlPlane(ensure_binaries()) as cp:
        objects = []
        for name in ("namespace.yaml", "crd-gputopology.yaml", "crd-gpuschedulingpolicy.yaml", "rbac.yaml"):
            objects += load_manifest(MANIFESTS / name)
        cp.create_objects(objects, exist_ok=True)
        wait_for_crd(cp.api_client(), "gputopologies.linkpack.io")
        for i in range(nodes):
            name = f"bench-{i:04d}"
            publish_node(cp, name, node_topology(name, "hgx-h100"))
        client.CoreV1Api(cp.api_client()).create_namespace({"metadata": {"name": NAMESPACE}})
        rows = [
            r
            for r in _rows(extender_tls(cp), baseline, plain_floor, ours_source)
            if only is None or r.key in only
        ]
        rates: dict[str, list[float]] = {r.key: [] for r in rows}
        empty: dict[str, list[int]] = {r.key: [] for r in rows}
        cpu: dict[str, list[float]] = {r.key: [] for r in rows}
        standby: dict[str, list[float]] = {r.key: [] for r in rows}
        for round_no in range(rounds):
            for row in rows:
                rate, left, cpu_ms, standby_ms = row.run(cp, pods)
                rates[row.key].append(rate)
                empty[row.key].append(left)
                cpu[row.key].append(cpu_ms)
                standby[row.key].append(standby_ms)
                print(
                    f"round {round_no + 1}: {row.key} {rate:.1f} pods/s, {left} empty nodes, "
                    f"extender {cpu_ms:.1f} CPU ms/pod"
                    + (f", second replica {standby_ms:.1f}" if standby_ms else ""),
                    flush=True,
                )
        return {
            "nodes": nodes,
            "pods": pods,
            "rounds": rounds,
            "labels": {r.key: r.label for r in rows},
            "rates": rates,
            "empty": empty,
            "cpu": cpu,
            "standby": standby,
        }


def render(r: dict[str, object]) -> str:
    rates: dict[str, list[float]] = r["rates"]  # type: ignore[assignment]
    empty: dict[str, list[int]] = r["empty"]  # type: ignore[assignment]
    cpu: dict[str, list[float]] = r["cpu"]  # type: ignore[assignment]
    labels: dict[str, str] = r["labels"]  # type: ignore[assignment]
    standby: dict[str, list[float]] = r.get("standby") or {}  # type: ignore[assignment]
    rounds = int(r["rounds"])  # type: ignore[call-overload]

    def ratio(key: str, to: str) -> str:
        per_round = [a / b for a, b in zip(rates[key], rates[to], strict=True)]
        return f"{statistics.median(per_round):.2f} ({min(per_round):.2f}-{max(per_round):.2f})"

    lines = [
        f"Real kube-scheduler (pinned release), {r['nodes']} fake 8-GPU nodes (8x H100 NVSwitch topology "
        f"each), {r['pods']} one-GPU pods created before the scheduler starts; pods/s until all are bound. "
        f"Scheduler client rate limit lifted (qps/burst {CLIENT_QPS}) in every row. {rounds} rounds, each "
        "running every row once, one after the other, on the same machine; median (min-max) over the rounds. "
        'Ratios are taken within a round. "Empty nodes" counts nodes left without any pod: the room kept '
        "for 8-GPU jobs (higher is better packing).",
        "",
        "| setup | pods/s, median (min-max) | ratio to floor (mutual TLS) | ratio to no extender | extender CPU ms per pod (median) | empty nodes after (median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def cpu_cell(key: str) -> str:
        own = f"{statistics.median(cpu[key]):.1f}"
        second = standby.get(key) or []
        return f"{own} + {statistics.median(second):.1f}" if any(second) else own

    for key, values in rates.items():
        lines.append(
            f"| {labels[key]} | {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) | "
            f"{ratio(key, 'floor') if 'floor' in rates and key != 'none' else '-'} | "
            f"{ratio(key, 'none') if 'none' in rates else '-'} | "
            f"{cpu_cell(key)} | {int(statistics.median(empty[key]))} |"
        )
    lines += [
        "",
        "Targets: ours at least 0.9 of the floor (mutual TLS) in the same run, aiming at 0.6 of the "
        'plain scheduler. "Extender CPU ms per pod" is the extender process\'s user + system time '
        "from the scheduler's start until the last pod is bound, divided by the pods: on a shared "
        "machine it is steadier than the rate. With two replicas it is the called replica's plus the "
        "second's: what one more replica costs while it only follows the watches (each replica runs "
        "every watch, the reconciler and the ledger's compare-and-swap; kube-scheduler reaches one of "
        "them per connection through the Service).",
        "",
        "Reproduce: `make bench-extender` (this part: `python -m bench.scheduler_throughput`; "
        "`--baseline-rev REV` adds our extender at an earlier revision as a row, `--profile DIR` "
        "records py-spy samples of ours, which needs `pip install py-spy`).",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The tree of git revision `rev` in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="linkpack-rev-") as tmp:
        target = Path(tmp) / rev[:12]
        target.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev],
            check=True,
            capture_output=True,
        ).stdout
        archive_path = Path(tmp) / "tree.tar"
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(target, filter="data")
        yield target


def main(argv: list[str] | None = None) -> int:
    from bench.report_file import replace_section

    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_throughput", description=__doc__)
    parser.add_argument("--nodes", type=int, default=400)
    parser.add_argument("--pods", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-rev", help="also run our extender from this git revision")
    parser.add_argument(
        "--ours-rev", help="run 'ours' from this git revision (default: the working tree as it is)"
    )
    parser.add_argument("--no-plain-floor", action="store_true", help="skip the plain-HTTP floor row")
    parser.add_argument(
        "--only", help="comma-separated row keys to run (none,floor,floor_plain,ours,replicas,baseline)"
    )
    parser.add_argument("--profile", type=Path, help="record py-spy samples of our extender here")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    global PROFILE_DIR
    PROFILE_DIR = args.profile
    with contextlib.ExitStack() as stack:
        baseline = stack.enter_context(checkout(args.baseline_rev)) if args.baseline_rev else None
        only = frozenset(args.only.split(",")) if args.only else None
        ours = stack.enter_context(checkout(args.ours_rev)) if args.ours_rev else REPO_ROOT
        result = measure(args.nodes, args.pods, args.rounds, baseline, not args.no_plain_floor, only, ours)
    text = render(result)
    print(text)
    print(json.dumps(result["rates"]))
    if not args.no_write:
        replace_section(Path("docs/BENCHMARKS.md"), "Extender throughput with the real kube-scheduler", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
