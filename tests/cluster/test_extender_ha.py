"""Two extender replicas behind one Service-like proxy, with the real kube-scheduler and API server.

Two `python -m extender` processes (mutual TLS) sit behind `ServiceProxy`, a round-robin TCP
proxy that only hands connections to Ready replicas, as a Service does. kube-scheduler runs the
shipped configuration pointed at the proxy. Two fake 8x H100 nodes with GpuTopology records
take a churn of whole-GPU and shared pods, created and deleted in waves; one replica is
SIGKILLed in the middle of a wave and started again later. Throughout, the ledger objects are
read back from the API: no GPU is ever in two entries at once, every pod gets bound, every
bound pod's allocation is its ledger entry, and once the pods are gone so are their entries.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from contract.allocation import decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from contract.ledger import Ledger, ledger_from_config_map
from tests.cluster.controlplane import ControlPlane, temporary_namespace
from tests.cluster.linkpack_env import (
    HOSTNAME,
    ExtenderProcess,
    extender_tls,
    node_topology,
    published_nodes,
    scheduler_config,
    wait_until,
)
from tests.cluster.service_proxy import Backend, ServiceProxy
from tests.support.pods import api_pod_manifest
from topology.accounting import accumulate

pytestmark = pytest.mark.cluster
NODES = ("ha-h100-a", "ha-h100-b")
TOPOLOGIES = {node: node_topology(node, "hgx-h100") for node in NODES}
# One wave: 5 whole GPUs and two half GPUs; two waves alive at once fit in the 16 GPUs.
WAVE = (
    {"gpus": 1},
    {"gpus": 2},
    {"units": 50, "memory": 8192},
    {"gpus": 1},
    {"units": 50, "memory": 8192},
    {"gpus": 1},
)
WAVES = 8
KILL_WAVE, RESTART_WAVE = 3, 5
_START_LIMIT_S = 240.0
_FILTERS = re.compile(r'^linkpack_extender_request_seconds_count\{verb="filter"\} (\S+)$', re.MULTILINE)


def _core(cp: ControlPlane) -> Any:
    return client.CoreV1Api(cp.api_client())


def _ledgers(cp: ControlPlane) -> list[Ledger]:
    maps = _core(cp).list_namespaced_config_map("linkpack-system", label_selector="linkpack.io/ledger=true")
    return [ledger_from_config_map(client.ApiClient().sanitize_for_serialization(m)) for m in maps.items]


class LedgerWatch:
    """Reads every ledger again and again while the churn runs, recording any GPU held twice."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp, self.reads = cp, 0
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def check(self) -> None:
        for ledger in _ledgers(self.cp):
            if ledger.node not in TOPOLOGIES:
                continue
            whole = [g.index for g in ledger.grants() if g.whole]
            if len(whole) != len(set(whole)):
                self.problems.append(f"{ledger.node}: a whole GPU in two entries: {sorted(whole)}")
            _, overcommits = accumulate(TOPOLOGIES[ledger.node], list(ledger.grants()), 100)
            if overcommits:
                self.problems.append(f"{ledger.node}: {overcommits}")
        self.reads += 1

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.check()

    def __enter__(self) -> LedgerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def ha_installation(
    linkpack_crd: ControlPlane,
) -> Iterator[tuple[ControlPlane, list[ExtenderProcess], ServiceProxy]]:
    cp = linkpack_crd
    tls = extender_tls(cp)
    replicas = [ExtenderProcess(cp.kubeconfig_path, cp.log_dir / f"extender-ha-{n}.log", tls) for n in "ab"]
    with published_nodes(cp, TOPOLOGIES):
        try:
            for replica in replicas:
                replica.start(timeout_s=_START_LIMIT_S)
            backends = tuple(
                Backend(f"replica-{n}", r.port, r.ops_url) for n, r in zip("ab", replicas, strict=True)
            )
            with ServiceProxy(backends, idle_close_s=2.0) as proxy:
                wait_until(lambda: len(proxy.ready()) == 2, 30, "both replicas Ready behind the proxy")
                cp.start_scheduler(scheduler_config(cp, proxy.url, tls))
                try:
                    yield cp, replicas, proxy
                finally:
                    cp.stop_scheduler()
        finally:
            for replica in replicas:
                replica.kill()


def _pod(name: str, shape: dict[str, int]) -> dict[str, Any]:
    """A pod asking for `shape` (gpus, units, memory), kept to this module's nodes."""
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": list(NODES)}]}
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    return api_pod_manifest(name, affinity=affinity, **shape)


def _filters_served(replica: ExtenderProcess) -> float:
    try:
        text = httpx.get(f"{replica.ops_url}/metrics", timeout=2).text
    except httpx.TransportError:
        return 0.0
    match = _FILTERS.search(text)
    return float(match.group(1)) if match else 0.0


@pytest.mark.timeout(900)
def test_killing_a_replica_mid_churn_loses_nothing_and_never_shares_a_gpu(
    ha_installation: tuple[ControlPlane, list[ExtenderProcess], ServiceProxy],
) -> None:
    """Waves of pods are created while the previous wave is deleted; once both replicas have
    served the scheduler, replica a is SIGKILLed while a wave is being placed and restarted two
    waves later (it serves again). Every pod is bound, its annotation is its ledger entry, no
    ledger ever holds a GPU twice, and all entries go with their pods."""
    cp, (replica_a, replica_b), proxy = ha_installation
    core = _core(cp)
    with temporary_namespace(cp.api_client(), prefix="ha-") as namespace, LedgerWatch(cp) as watch:
        previous: list[str] = []
        bound_once: dict[str, str] = {}
        for wave in range(WAVES):
            names = [f"w{wave}-{i}" for i in range(len(WAVE))]
            if wave == KILL_WAVE:
                wait_until(
                    lambda: all(_filters_served(r) > 0 for r in (replica_a, replica_b)),
                    60,
                    "both replicas to have served the scheduler",
                )
            for i, (name, shape) in enumerate(zip(names, WAVE, strict=True)):
                core.create_namespaced_pod(namespace, _pod(name, shape))
                if wave == KILL_WAVE and i == 1:
                    replica_a.kill()  # SIGKILL while the wave is being placed and the last one deleted
                if i == 1:
                    for old in previous:  # churn: the last wave goes while this one is being placed
                        core.delete_namespaced_pod(old, namespace, grace_period_seconds=0)
            if wave == RESTART_WAVE:
                # same ports; Ready (and routed to) only after its initial sync. A start takes
                # tens of seconds on a loaded 2-core machine: the limit is generous.
                replica_a.start(timeout_s=_START_LIMIT_S)

            def wave_bound(names: list[str] = names) -> bool:
                pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
                for name in names:
                    if pods.get(name) is not None and pods[name].spec.node_name:
                        bound_once[name] = pods[name].spec.node_name
                return all(name in bound_once for name in names)

            wait_until(wave_bound, 120, f"every pod of wave {wave} bound")
            _assert_bound_pods_match_their_ledger_entries(cp, namespace)
            previous = names
        assert len(proxy.ready()) == 2
        for name in previous:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

        def entries_gone() -> bool:
            return not [e for ledger in _ledgers(cp) for e in ledger.entries if e.namespace == namespace]

        wait_until(entries_gone, 60, "the ledgers to release every pod of the churn")
        watch.check()
    assert watch.problems == []
    assert watch.reads > 10
    assert len(bound_once) == WAVES * len(WAVE)
    # Serving again. Whether the scheduler's own keep-alive connections reached the restarted
    # replica depends on timing; fresh connections alternate between the Ready replicas, so a
    # few calls through the proxy reach it.
    wait_until(
        lambda: _answers_through_the_proxy(proxy, replica_a), 30, "the restarted replica to answer a call"
    )


def _answers_through_the_proxy(proxy: ServiceProxy, replica: ExtenderProcess) -> bool:
    """One filter call (a body the extender rejects, which it still counts) on a new connection
    through the proxy; True once `replica` has answered filter calls since it started."""
    with replica.scheduler_client() as http:
        assert http.post(f"{proxy.url}/filter", json={"Pod": None}).status_code == 200
    return _filters_served(replica) > 0


def _assert_bound_pods_match_their_ledger_entries(cp: ControlPlane, namespace: str) -> None:
    """Each bound pod of the namespace has exactly one ledger entry, on its node, with the
    allocation its annotation carries."""
    entries: dict[str, list[tuple[str, Any]]] = {}
    for ledger in _ledgers(cp):
        for entry in ledger.entries:
            entries.setdefault(entry.pod_uid, []).append((ledger.node, entry.allocation))
    for pod in _core(cp).list_namespaced_pod(namespace).items:
        if not pod.spec.node_name or pod.metadata.deletion_timestamp:
            continue
        allocation = decode_allocation(pod.metadata.annotations[ALLOCATION_ANNOTATION])
        held = [a for node, a in entries.get(pod.metadata.uid, []) if node == pod.spec.node_name]
        assert held == [allocation], f"{pod.metadata.name} on {pod.spec.node_name}: {held} vs {allocation}"
