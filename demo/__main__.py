"""`python -m demo`: start the extender on an embedded cluster and schedule a mixed pod stream.

The pods go through the extender's own HTTP verbs exactly as kube-scheduler calls them
(filter, then prioritize when more than one node passes, then bind). A report follows, and
the extender stays up (metrics and debug views) until interrupted, unless `--once`.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import httpx
import uvicorn

from demo.cluster import DemoNode, build_cluster
from demo.real_cluster import DEMO_SCHEDULER, RealClusterPods
from demo.report import Outcome, render_report
from demo.workload import DEMO_NAMESPACE, pod_stream
from extender.config import ExtenderConfig
from extender.kube.client import KubeClusterApi, load_client
from extender.service import ExtenderService, handlers_for
from extender.serving.app import create_app


class PodTarget(Protocol):
    """Where the demo creates its pods and reads them back (embedded or real cluster)."""

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]: ...

    def pods(self) -> list[dict[str, Any]]: ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def where_to_look(base: str, nodes: list[str], outcomes: list[Outcome]) -> str:
    """The extender's pages, and how to ask why a pod the demo could not place is pending."""
    lines = [
        "",
        f"Extender: {base}",
        f"  every node:  {base}/debug/topology",
        f"  metrics:     {base}/metrics",
    ]
    if nodes:
        lines.append(f"  one node:    {base}/debug/topology/{nodes[0]}")
    pending = next((o for o in outcomes if not o.node), None)
    if pending is not None:
        lines += [
            f"Why is pod {DEMO_NAMESPACE}/{pending.pod} pending?",
            f"  kubectl linkpack explain {DEMO_NAMESPACE}/{pending.pod} --extender-url {base}",
            f"  (or {base}/debug/explain/{DEMO_NAMESPACE}/{pending.pod})",
        ]
    return "\n".join(lines)


def schedule(http: httpx.Client, pod: dict[str, Any], nodes: list[str]) -> Outcome:
    """One scheduling cycle the way kube-scheduler drives an extender."""
    args = {"Pod": pod, "Nodes": None, "NodeNames": nodes}
    filtered = http.post("/filter", json=args).json()
    passed = filtered["NodeNames"] or []
    if filtered.get("Error"):
        return Outcome(pod["metadata"]["name"], "", filtered["Error"])
    if not passed:
        reasons = {**filtered["FailedNodes"], **filtered["FailedAndUnresolvableNodes"]}
        return Outcome(pod["metadata"]["name"], "", _summarise(reasons, len(nodes)))
    if len(passed) == 1:
        chosen = passed[0]
    else:
        scores = http.post("/prioritize", json={**args, "NodeNames": passed}).json()
        best = max(s["Score"] for s in scores)
        chosen = next(s["Host"] for s in scores if s["Score"] == best)
    meta = pod["metadata"]
    bound = http.post(
        "/bind",
        json={
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": chosen,
        },
    ).json()
    return Outcome(meta["name"], chosen if not bound["Error"] else "", bound["Error"])


def _summarise(reasons: dict[str, str], total: int) -> str:
    """Group reasons like kube-scheduler's FailedScheduling message does."""
    counts: dict[str, int] = {}
    for reason in reasons.values():
        counts[reason] = counts.get(reason, 0) + 1
    parts = ", ".join(f"{n} {r}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"0/{total} nodes are available: {parts}"


def _real_cluster(
    config: ExtenderConfig, kubeconfig: str, stopping: threading.Event
) -> tuple[ExtenderService, RealClusterPods, list[DemoNode], Callable[[], None]]:
    # the demo's pods name a scheduler of their own, so only the demo drives them; its extender
    # serves that name (the extender refuses pods of any other scheduler)
    config = replace(config, scheduler_name=DEMO_SCHEDULER)
    api = KubeClusterApi(load_client(kubeconfig), config)
    service = ExtenderService(config, api)
    watches = threading.Thread(
        target=api.run_watches,
        args=(handlers_for(service), stopping.is_set),
        name="demo-watches",
        daemon=True,
    )
    watches.start()

    def stop() -> None:
        stopping.set()
        api.close()  # ends the watches' open requests at once
        watches.join(timeout=2)  # a watch in flight ends by itself within its timeout

    deadline = time.monotonic() + 60
    while not service.ready():
        if time.monotonic() > deadline:
            raise SystemExit("error: the cluster's nodes, pods and topology records did not list within 60 s")
        time.sleep(0.2)
    nodes = []
    snapshot = service.store.snapshot()
    for name in snapshot.node_names():
        entry = snapshot.node(name)
        record = entry.published if entry is not None else None
        if record is not None and record.topology.gpus:
            t = record.topology
            nodes.append(DemoNode(name, "(published)", t.gpu_count, t.gpus[0].model, t.sources))
    return service, RealClusterPods(api.api_client), nodes, stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--pods", type=int, default=60, help="how many pods to schedule (default 60)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--port", type=int, default=0, help="extender port (default: a free one)")
    parser.add_argument("--once", action="store_true", help="exit after the report")
    parser.add_argument(
        "--kubeconfig",
        help="use the real cluster of this kubeconfig instead of the embedded one (its GPU nodes must "
        "have GpuTopology records from the node agent); demo pods go to namespace linkpack-demo",
    )
    args = parser.parse_args(argv)

    config = ExtenderConfig()
    target: PodTarget
    stop_watches: Callable[[], None] = lambda: None  # noqa: E731
    if args.kubeconfig:
        service, target, nodes, stop_watches = _real_cluster(config, args.kubeconfig, threading.Event())
    else:
        cluster, nodes = build_cluster(config)
        service = ExtenderService(config, cluster)
        cluster.run_watches(handlers_for(service), lambda: True)
        target = cluster
    port = args.port or _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10) as http:
        for _ in range(100):
            try:
                if http.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        names = [n.name for n in nodes] or list(service.store.snapshot().node_names())
        outcomes = []
        started = time.perf_counter()
        for pod in pod_stream(args.pods, args.seed):
            created = target.create_pod(pod)
            outcomes.append(schedule(http, created, names))
        elapsed = time.perf_counter() - started
    print(render_report(nodes, service, target, outcomes, elapsed))
    print(where_to_look(base, names, outcomes))
    try:
        if args.once:
            return 0
        print("Press Ctrl-C to stop.")
        try:
            while thread.is_alive():
                thread.join(timeout=0.5)
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        stop_watches()


if __name__ == "__main__":
    sys.exit(main())
