"""Churn and faults on a real node: waves of short GPU pods while the node's parts restart.

`run_churn` drives waves of `pods_per_wave` short pods (1 or 2 whole GPUs, a 25-unit share or
one MIG instance of the stack's MIG GPU, a quarter each; 3-8 s each, seeded) on the real node
through the real scheduler, extender, kubelet and node agent; each wave starts when the last one
has finished. Some pods run to completion, some are
deleted gracefully, some with `--force` (grace 0) while they run. At chosen waves the kubelet,
the node agent or the extender is restarted while the wave runs. Before the first wave one GPU
is cordoned (node annotation) and one is made unhealthy (an injected XID), both among the whole
GPUs (the MIG GPU's instances are the only ones MIG pods can get).

Every poll checks, on the kubelet's own pod-resources account: no GPU held whole by one pod is
held by another pod too, and no MIG instance is held by two pods; every running container's
NVIDIA_VISIBLE_DEVICES is exactly what the account names for its pod (for a MIG pod, the MIG
instance's UUID) and what its record grants; no pod got the cordoned or unhealthy GPU. It counts
admission rejections (pods Failed at admission) and measures creation-to-Running times.

`python -m tests.node.churn` runs it on a fresh control plane and node and prints the report
(root needed; see tests/node/real_node.py).
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.keys import CORDON_ANNOTATION
from tests.cluster.controlplane import wait_for
from tests.node.checks import double_counted, kubelet_gpus, mig_double_held, recorded_devices, visible_gpus
from tests.node.linkpack_stack import MIG_GPU, MIG_RESOURCE, LinkpackStack, env_of, recorded
from tests.node.real_node import host_pod, stop_signal_safe
from tests.support.resources import GPU, NAMES, SHARED

KINDS: tuple[tuple[str, dict[str, str]], ...] = (
    ("gpu1", {GPU: "1"}),
    ("gpu2", {GPU: "2"}),
    ("share", {SHARED: "25"}),
    ("mig", {MIG_RESOURCE: "1"}),
)
CORDONED_GPU = 5
UNHEALTHY_GPU = 6
assert MIG_GPU not in (CORDONED_GPU, UNHEALTHY_GPU)  # MIG pods have no other GPU to go to


@dataclass(frozen=True)
class ChurnPlan:
    waves: int = 6
    pods_per_wave: int = 8
    seed: int = 7
    #: wave index -> what restarts while that wave runs
    restarts: Mapping[int, str] = field(default_factory=lambda: {1: "kubelet", 3: "agent", 4: "extender"})
    wave_timeout_s: float = 150.0


@dataclass
class PodTrack:
    name: str
    kind: str
    ending: str  # complete | delete | force
    run_s: int
    created: float
    running_at: float | None = None
    checked_env: bool = False
    record_since: float | None = None  # when the record was first seen differing (a swap settles)
    done: bool = False
    deleted: bool = False


@dataclass
class ChurnReport:
    pods: int = 0
    waves: int = 0
    completed: int = 0
    deleted_gracefully: int = 0
    deleted_forced: int = 0
    admission_rejections: int = 0
    rejected: list[str] = field(default_factory=list)
    double_holds: int = 0
    double_hold_examples: list[str] = field(default_factory=list)
    env_mismatches: int = 0
    env_mismatch_examples: list[str] = field(default_factory=list)
    unavailable_handed_out: int = 0
    unavailable_examples: list[str] = field(default_factory=list)
    never_ran: list[str] = field(default_factory=list)
    env_checked: int = 0
    records_swapped: int = 0
    restarts: list[str] = field(default_factory=list)
    to_running_s: list[float] = field(default_factory=list)
    wave_slowest_s: list[float] = field(default_factory=list)  # per wave, creation to Running
    duration_s: float = 0.0

    def percentile(self, q: float) -> float:
        values = sorted(self.to_running_s)
        if not values:
            return 0.0
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("to_running_s")
        out["to_running_p50_s"] = round(self.percentile(0.5), 2)
        out["to_running_p99_s"] = round(self.percentile(0.99), 2)
        out["to_running_max_s"] = round(max(self.to_running_s, default=0.0), 2)
        return out


def _plan_wave(rng: random.Random, wave: int, size: int) -> list[tuple[str, str, dict[str, str], str, int]]:
    out = []
    for i in range(size):
        kind, limits = KINDS[rng.randrange(len(KINDS))]
        ending = rng.choices(("complete", "delete", "force"), weights=(6, 2, 2))[0]
        out.append((f"w{wave}-{i}-{kind}", kind, limits, ending, rng.randint(3, 8)))
    return out


def _unavailable(stack: LinkpackStack) -> frozenset[str]:
    """Cordon one GPU and make another unhealthy; their UUIDs, once the extender can see both."""
    core = client.CoreV1Api(stack.cp.api_client())
    custom = client.CustomObjectsApi(stack.cp.api_client())
    topo = custom.get_cluster_custom_object("linkpack.io", "v1alpha1", "gputopologies", stack.node.node)
    gpus = {g["index"]: g["uuid"] for g in topo["spec"]["gpus"]}
    core.patch_node(stack.node.node, {"metadata": {"annotations": {CORDON_ANNOTATION: gpus[CORDONED_GPU]}}})
    answer = httpx.post(f"{stack.agent.url}/debug/inject", json={"gpu": UNHEALTHY_GPU, "xid": 79}, timeout=5)
    assert answer.status_code == 200, answer.text

    def published() -> bool:
        status = custom.get_cluster_custom_object(
            "linkpack.io", "v1alpha1", "gputopologies", stack.node.node
        )["status"]
        health = {h["index"]: h for h in status.get("gpuHealth") or []}
        return bool(not health[UNHEALTHY_GPU]["healthy"] and health[CORDONED_GPU].get("cordoned"))

    wait_for(published, 30, "the cordon and the fault in the GpuTopology status")
    time.sleep(2)  # the extender's watch applies the status
    return frozenset({gpus[CORDONED_GPU], gpus[UNHEALTHY_GPU]})


def _restart(stack: LinkpackStack, what: str) -> None:
    if what == "kubelet":
        stack.node.restart_kubelet()
    elif what == "agent":
        stack.restart_agent()
        # the simulated GPU's fault lives in the agent process: the new one is told again
        answer = httpx.post(
            f"{stack.agent.url}/debug/inject", json={"gpu": UNHEALTHY_GPU, "xid": 79}, timeout=5
        )
        assert answer.status_code == 200, answer.text
    else:
        stack.restart_extender()


def _check(
    stack: LinkpackStack,
    core: Any,
    namespace: str,
    tracks: dict[str, PodTrack],
    report: ChurnReport,
    unavailable: frozenset[str],
) -> None:
    try:
        account = stack.pod_resources()
    except OSError:
        return  # the kubelet is restarting
    ours = [a for a in account if a.namespace == namespace]
    doubles = double_counted(ours, GPU) | mig_double_held(ours, NAMES.mig_prefix)
    if doubles:
        report.double_holds += 1
        if len(report.double_hold_examples) < 5:
            report.double_hold_examples.append(json.dumps({k: sorted(v) for k, v in doubles.items()}))
    for a in account:
        if a.namespace != namespace:
            continue
        gpus = kubelet_gpus([a], namespace, a.pod)
        if gpus & unavailable and a.pod not in report.unavailable_examples:
            report.unavailable_handed_out += 1
            report.unavailable_examples.append(a.pod)
    for track in tracks.values():
        if track.running_at is None or track.checked_env or track.done:
            continue
        try:
            pod = core.read_namespaced_pod(track.name, namespace)
        except ApiException:
            continue
        env = env_of(stack.node.container_log(namespace, track.name, pod.metadata.uid, "main"))
        if "PATH" not in env:
            continue
        held = kubelet_gpus(account, namespace, track.name)
        if not held:
            continue
        record = recorded(pod)
        want = recorded_devices(record.grants) if record is not None else frozenset()
        now = time.monotonic()
        if visible_gpus(env) == held and held != want:
            # two pods of one shape admitted in the other order: the node swaps their records
            track.record_since = track.record_since or now
            if now - track.record_since < 15:
                continue
        track.checked_env = True
        report.env_checked += 1
        if track.record_since is not None:
            report.records_swapped += 1
        if visible_gpus(env) != held or held != want:
            report.env_mismatches += 1
            if len(report.env_mismatch_examples) < 5:
                report.env_mismatch_examples.append(
                    f"{track.name}: env {sorted(visible_gpus(env))} kubelet {sorted(held)} record {sorted(want)}"
                )


def _started(pod: Any) -> bool:
    """Whether the pod's container has started (it may have finished between two looks)."""
    for status in pod.status.container_statuses or []:
        state = status.state
        if state is not None and (state.running is not None or state.terminated is not None):
            return True
    return False


def _due_for_deletion(track: PodTrack, now: float) -> bool:
    """A pod to delete (not one to run to completion) that has run for a second."""
    if track.ending == "complete" or track.deleted or track.running_at is None:
        return False
    return now - track.running_at >= 1.0


def _delete(core: Any, namespace: str, track: PodTrack, report: ChurnReport) -> None:
    grace = 0 if track.ending == "force" else 2
    try:
        core.delete_namespaced_pod(
            track.name, namespace, body=client.V1DeleteOptions(grace_period_seconds=grace)
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
    track.deleted = True
    if track.ending == "force":
        report.deleted_forced += 1
    else:
        report.deleted_gracefully += 1


def run_churn(stack: LinkpackStack, namespace: str, plan: ChurnPlan | None = None) -> ChurnReport:
    plan = plan or ChurnPlan()
    rng = random.Random(plan.seed)
    core = client.CoreV1Api(stack.cp.api_client())
    report = ChurnReport()
    unavailable = _unavailable(stack)
    try:
        _waves(stack, core, namespace, plan, rng, report, unavailable)
    finally:  # the node is shared by the session: the cordon goes again
        core.patch_node(stack.node.node, {"metadata": {"annotations": {CORDON_ANNOTATION: None}}})
    return report


def _waves(
    stack: LinkpackStack,
    core: Any,
    namespace: str,
    plan: ChurnPlan,
    rng: random.Random,
    report: ChurnReport,
    unavailable: frozenset[str],
) -> None:
    started = time.monotonic()
    for wave in range(plan.waves):
        tracks: dict[str, PodTrack] = {}
        for name, kind, limits, ending, run_s in _plan_wave(rng, wave, plan.pods_per_wave):
            command = stop_signal_safe(f"env; sleep {run_s} & wait")
            core.create_namespaced_pod(namespace, host_pod(name, command, limits=limits))
            tracks[name] = PodTrack(name, kind, ending, run_s, time.monotonic())
        report.pods += len(tracks)
        restart = plan.restarts.get(wave)
        restarter: threading.Thread | None = None
        wave_start = time.monotonic()
        while not all(t.done for t in tracks.values()):
            now = time.monotonic()
            if restart and now - wave_start > 1.5:  # in the background: the checks go on meanwhile
                restarter = threading.Thread(target=_restart, args=(stack, restart), daemon=True)
                restarter.start()
                report.restarts.append(f"wave {wave}: {restart}")
                restart = None
            if now - wave_start > plan.wave_timeout_s:
                report.never_ran += [t.name for t in tracks.values() if not t.done]
                break
            listed = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
            for track in tracks.values():
                if track.done:
                    continue
                pod = listed.get(track.name)
                if pod is None:
                    track.done = True  # deleted and gone
                    continue
                phase = pod.status.phase
                if track.running_at is None and (phase == "Running" or _started(pod)):
                    track.running_at = now
                    report.to_running_s.append(now - track.created)
                if phase == "Failed" and track.running_at is None:
                    report.admission_rejections += 1
                    report.rejected.append(
                        f"{track.name}: {pod.status.reason}: {(pod.status.message or '')[:200]}"
                    )
                    track.done = True
                elif phase in ("Succeeded", "Failed"):
                    track.done = True
                    report.completed += not track.deleted
                elif _due_for_deletion(track, now):
                    _delete(core, namespace, track, report)
            _check(stack, core, namespace, tracks, report, unavailable)
            time.sleep(0.3)
        for track in tracks.values():
            if (
                track.running_at is None
                and track.name not in report.never_ran
                and not any(r.startswith(f"{track.name}:") for r in report.rejected)
            ):
                report.never_ran.append(track.name)
        for name in tracks:  # finished pods go; their GPUs are the node's to release
            try:
                core.delete_namespaced_pod(name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        report.waves += 1
        ran = [t.running_at - t.created for t in tracks.values() if t.running_at is not None]
        report.wave_slowest_s.append(round(max(ran, default=0.0), 1))
    report.duration_s = round(time.monotonic() - started, 1)


def markdown(report: ChurnReport, plan: ChurnPlan) -> str:
    s = report.summary()
    rows = [
        ("pods (waves x pods per wave)", f"{s['pods']} ({s['waves']} x {plan.pods_per_wave})"),
        (
            "ran to completion / deleted gracefully / deleted with --force",
            f"{s['completed']} / {s['deleted_gracefully']} / {s['deleted_forced']}",
        ),
        ("restarts while a wave ran", ", ".join(report.restarts) or "none"),
        ("admission rejections", str(s["admission_rejections"])),
        ("polls seeing a GPU held whole, or a MIG instance held, by two pods", str(s["double_holds"])),
        ("cordoned/unhealthy GPUs handed out", str(s["unavailable_handed_out"])),
        (
            "containers checked: env = pod-resources = record",
            f"{s['env_checked']} ({s['env_mismatches']} mismatches)",
        ),
        ("records the node swapped (two pods admitted in the other order)", str(s["records_swapped"])),
        ("pods that never ran", str(len(report.never_ran))),
        (
            "creation to Running p50 / p99 / max",
            f"{s['to_running_p50_s']} s / {s['to_running_p99_s']} s / {s['to_running_max_s']} s",
        ),
        ("slowest creation to Running, wave by wave", " / ".join(f"{v} s" for v in report.wave_slowest_s)),
        ("duration", f"{s['duration_s']} s"),
    ]
    return "\n".join(["| measure | value |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)])


def main() -> int:
    from tests.cluster.binaries import build_kubelet, ensure_binaries
    from tests.cluster.controlplane import (
        MANIFESTS,
        ControlPlane,
        load_manifest,
        temporary_namespace,
        wait_for_crd,
    )
    from tests.node.linkpack_stack import running_stack
    from tests.node.packages import ensure_node_packages
    from tests.node.real_node import RealNode

    ensure_node_packages()
    binaries, kubelet = ensure_binaries(), build_kubelet()
    plan = ChurnPlan()
    with ControlPlane(binaries) as cp:
        objects = []
        for name in ("namespace.yaml", "crd-gputopology.yaml", "crd-gpuschedulingpolicy.yaml", "rbac.yaml"):
            objects += load_manifest(MANIFESTS / name)
        cp.create_objects(objects, exist_ok=True)
        wait_for_crd(cp.api_client(), "gputopologies.linkpack.io")
        node = RealNode(cp, kubelet)
        node.start()
        try:
            with running_stack(node) as stack, temporary_namespace(cp.api_client(), prefix="churn-") as ns:
                report = run_churn(stack, ns, plan)
        finally:
            node.stop()
    print(markdown(report, plan))
    print(json.dumps(report.summary(), indent=1))
    ok = report.admission_rejections == 0 and not report.double_holds and not report.env_mismatches
    return 0 if ok and not report.unavailable_handed_out and not report.never_ran else 1


if __name__ == "__main__":
    sys.exit(main())
