"""`python -m bench.cluster.replay`: a sample of the openb trace through the real kube-scheduler and
the extender, against the simulator's "ours" on the same sample and arrival order.

- Sample: `--nodes` GPU nodes drawn from the openb node list with the seed; the GPU pods of the
  trace in the protocol's arrival order for that seed (`bench.cluster.protocol.build_arrivals`),
  cut where the arrived GPU requests reach 100% of the sample's capacity. CPU-only pods are left
  out: the extender never sees them, and kube-scheduler's own scores would place them at random
  among ties, which no simulator run can repeat.
- Real: one control plane (etcd, kube-apiserver, kube-scheduler with the shipped configuration)
  with one fake node per sampled node (the trace's CPU and memory as allocatable, its GPUs as
  `nvidia.com/gpu` and share units, a GpuTopology from `bench.cluster.topologies`) and the
  extender under its default policy (it decides the node). Pods are created one at a time, each
  waited for until bound or unschedulable (then deleted: the protocol drops failed pods).
- Simulated: `bench.cluster.ours` on the same nodes and pods in the same order.

Shares are asked as share units (1/100 GPU, the default), so a trace share of s milli asks
ceil(s/10) units and the simulator is given the same rounded share.
Printed: GPUs unallocated at the end (100% arrival) on each side and the difference.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from kubernetes import client

from bench.cluster.cluster import SimulatedCluster
from bench.cluster.ours import ours_factory
from bench.cluster.policy import RunContext
from bench.cluster.protocol import build_arrivals, policy_stream
from bench.cluster.simulate import schedule
from bench.cluster.topologies import topology_for
from bench.cluster.trace import (
    MILLI_PER_GPU,
    NODE_FILE,
    TraceNode,
    TracePod,
    load_nodes,
    load_pods,
    openb_dir,
    pod_file,
)
from contract.gpu_topology import encode_topology
from tests.cluster.binaries import ensure_binaries
from tests.cluster.controlplane import MANIFESTS, ControlPlane, load_manifest, wait_for_crd
from tests.cluster.linkpack_env import ExtenderProcess, extender_tls, scheduler_config

UNITS_PER_GPU = 100
NAMESPACE = "replay"


def sample(
    nodes: Sequence[TraceNode], pods: Sequence[TracePod], count: int, seed: int
) -> tuple[tuple[TraceNode, ...], list[TracePod]]:
    """`count` nodes and the GPU pods arriving until 100% of their GPU capacity, shares rounded to units."""
    chosen = tuple(sorted(random.Random(seed).sample(list(nodes), count), key=lambda n: n.name))
    per_unit = MILLI_PER_GPU // UNITS_PER_GPU
    gpu_pods = tuple(
        replace(p, gpu_milli=math.ceil(p.gpu_milli / per_unit) * per_unit) if p.is_fractional else p
        for p in pods
        if p.gpu_count > 0
    )
    capacity = sum(n.gpu_count for n in chosen) * MILLI_PER_GPU
    arrivals = build_arrivals(gpu_pods, len(chosen), capacity, seed)
    out, arrived = [], 0
    for index in arrivals.pod_order:
        pod = gpu_pods[index]
        if arrived + pod.gpu_total_milli > capacity:
            break
        out.append(replace(pod, name=f"r-{len(out):05d}"))
        arrived += pod.gpu_total_milli
    return chosen, out


def simulated(nodes: tuple[TraceNode, ...], pods: list[TracePod], seed: int) -> int:
    """Allocated milli-GPU after the simulator's ours placed `pods` in order."""
    cluster = SimulatedCluster(nodes, ())
    priority = np.arange(cluster.size, dtype=np.int64)
    policy = ours_factory()(RunContext(cluster, priority, policy_stream(seed), ()))
    trajectory = schedule(cluster, pods, policy)
    return int(trajectory.allocated_milli[-1]) if len(pods) else 0


def _pod_body(pod: TracePod) -> dict[str, object]:
    limits: dict[str, str] = {}
    if pod.is_fractional:
        limits["nvidia.com/gpu.shared"] = str(pod.gpu_milli * UNITS_PER_GPU // MILLI_PER_GPU)
    else:
        limits["nvidia.com/gpu"] = str(pod.gpu_count)
    requests = {**limits, "cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    return {
        "metadata": {"name": pod.name},
        "spec": {
            "schedulerName": "linkpack",
            "nodeSelector": {"linkpack-replay": "yes"},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/x",
                    "resources": {"limits": limits, "requests": requests},
                }
            ],
        },
    }


def _outcome(core: client.CoreV1Api, name: str, timeout_s: float = 120) -> bool:
    """True once bound, False once the scheduler says unschedulable."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        if pod.spec.node_name:
            return True
        for condition in (pod.status.conditions or []) if pod.status else []:
            if (
                condition.type == "PodScheduled"
                and condition.status == "False"
                and condition.reason == "Unschedulable"
            ):
                return False
        time.sleep(0.05)
    raise RuntimeError(f"pod {name} neither bound nor unschedulable after {timeout_s} s")


def real(nodes: tuple[TraceNode, ...], pods: list[TracePod]) -> int:
    """Allocated milli-GPU after the real scheduler and extender placed `pods` one at a time."""
    with ControlPlane(ensure_binaries()) as cp:
        objects = []
        for name in ("namespace.yaml", "crd-gputopology.yaml", "crd-gpuschedulingpolicy.yaml", "rbac.yaml"):
            objects += load_manifest(MANIFESTS / name)
        cp.create_objects(objects, exist_ok=True)
        wait_for_crd(cp.api_client(), "gputopologies.linkpack.io")
        custom = client.CustomObjectsApi(cp.api_client())
        for node in nodes:
            topology = topology_for(node.model, node.gpu_count)
            topology = replace(
                topology,
                gpus=tuple(
                    replace(g, uuid=f"GPU-{node.name}-{g.index:02d}-0000-0000-000000000000")
                    for g in topology.gpus
                ),
            )
            cp.create_fake_node(
                node.name,
                {
                    "cpu": f"{node.cpu_milli}m",
                    "memory": f"{node.memory_mib}Mi",
                    "nvidia.com/gpu": str(node.gpu_count),
                    "nvidia.com/gpu.shared": str(node.gpu_count * UNITS_PER_GPU),
                },
                labels={
                    "nvidia.com/gpu.present": "true",
                    "kubernetes.io/hostname": node.name,
                    "linkpack-replay": "yes",
                },
            )
            custom.create_cluster_custom_object(
                "linkpack.io",
                "v1alpha1",
                "gputopologies",
                {
                    "apiVersion": "linkpack.io/v1alpha1",
                    "kind": "GpuTopology",
                    "metadata": {"name": node.name},
                    "spec": encode_topology(topology),
                },
            )
        core = client.CoreV1Api(cp.api_client())
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        allocated = 0
        extender = ExtenderProcess(cp.kubeconfig_path, cp.log_dir / "replay-extender.log", extender_tls(cp))
        extender.start(timeout_s=600)  # generous: a loaded machine starts Python slowly
        try:
            cp.start_scheduler(
                scheduler_config(cp, extender.url, extender.tls).replace(
                    "leaderElect: true", "leaderElect: false"
                )
            )
            try:
                for i, pod in enumerate(pods):
                    core.create_namespaced_pod(NAMESPACE, _pod_body(pod))
                    if _outcome(core, pod.name):
                        allocated += pod.gpu_total_milli
                    else:
                        core.delete_namespaced_pod(pod.name, NAMESPACE, grace_period_seconds=0)
                    if i % 50 == 0:
                        print(f"  {i}/{len(pods)} pods", file=sys.stderr, flush=True)
            finally:
                cp.stop_scheduler()
        finally:
            extender.kill()
        return allocated


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster.replay", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trace", default="default")
    args = parser.parse_args(argv)
    nodes, pods = sample(
        load_nodes(openb_dir() / NODE_FILE), load_pods(pod_file(args.trace)), args.nodes, args.seed
    )
    capacity = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
    sim = simulated(nodes, pods, args.seed)
    started = time.perf_counter()
    live = real(nodes, pods)
    wall = time.perf_counter() - started
    sim_pct = 100 * (capacity - sim) / capacity
    live_pct = 100 * (capacity - live) / capacity
    print(
        f"trace {args.trace}, seed {args.seed}: {len(nodes)} nodes / {capacity // MILLI_PER_GPU} GPUs, "
        f"{len(pods)} GPU pods to 100% arrival. GPUs unallocated: real scheduler + extender "
        f"{live_pct:.2f}%, simulator {sim_pct:.2f}%, difference {live_pct - sim_pct:+.2f} points "
        f"({wall:.0f} s for the real run)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
