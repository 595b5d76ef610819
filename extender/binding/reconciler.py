"""Releases capacity that is committed but will never be used.

A ledger entry is stale when its pod was deleted, re-created, finished, bound to another node,
or never bound within the reservation timeout (an extender that crashed between commit and
Binding leaves such an entry). Deciding is pure (`extender.state.stale_entries`); this loop
only applies the decisions through the binder's release path.

Every extender replica runs this loop. A replica's watch-fed view may lag the API: another
replica's fresh commit can be seen before the pod it is for. So an entry found stale in the
cached view is released only after the pod itself is read from the API and the entry is
still stale by the same rules, and only that very entry is removed (a bind that renewed it
meanwhile keeps it: `Binder.release`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Protocol

from contract.handoff import admits_pods, released_by_node
from contract.ledger import Ledger, LedgerEntry
from contract.pods import PodRef
from extender.binding.binder import Binder
from extender.config import ExtenderConfig
from extender.metrics import ExtenderMetrics
from extender.state.cluster_api import ApiError, ApiNotFound, ClusterApi
from extender.state.snapshot import ClusterSnapshot
from extender.state.stale_entries import PodFacts, StaleReason, stale_entries
from extender.state.store import ClusterStore

#: Departures whose GPUs the kubelet may still hold: released only once the node says it does not.
_DEPARTED = frozenset({StaleReason.POD_DELETED, StaleReason.POD_REPLACED, StaleReason.POD_FINISHED})

log = logging.getLogger(__name__)


class ReconciledService(Protocol):
    """What the reconciler uses of the extender's service (`extender.service.ExtenderService`)."""

    config: ExtenderConfig
    api: ClusterApi
    store: ClusterStore
    binder: Binder
    metrics: ExtenderMetrics


def reconcile_once(service: ReconciledService, now: float | None = None) -> int:
    """Release every stale entry once; returns how many were released."""
    snapshot = service.store.snapshot()
    if not snapshot.is_synced(("ledgers", "pods")):
        return 0
    now = time.time() if now is None else now
    released = 0
    timeout = service.config.reservation_timeout_s
    departing: set[str] = set()
    readmitting = False
    for name, node in sorted(snapshot.nodes.items()):
        node_holds = node.published.status.holds if node.published is not None else None
        readmitting |= service.store.note_admitting(name, admits_pods(node_holds))
    for ledger in snapshot.ledgers():
        facts = snapshot.pod_facts(e.pod_uid for e in ledger.entries)
        ledger_node = snapshot.node(ledger.node)
        published = ledger_node.published if ledger_node is not None else None
        holds = published.status.holds if published is not None else None
        suspects: list[LedgerEntry] = []
        for entry, reason in stale_entries(ledger, facts, now, timeout):
            if reason in _DEPARTED:
                departed_at = service.store.note_departure(entry.pod_uid)
                ref = PodRef(entry.namespace, entry.name, entry.pod_uid)
                if not released_by_node(holds, ref, departed_at):
                    departing.add(entry.pod_uid)  # the node still holds it, or has not looked since
                    continue
            suspects.append(entry)
        if not suspects:
            continue
        live = live_pod_facts(service.api, tuple(suspects))
        departing.update(e.pod_uid for e in suspects if e.pod_uid not in live)  # undecided: ask again
        confirm = Ledger(ledger.node, tuple(e for e in suspects if e.pod_uid in live))
        for entry, reason in stale_entries(confirm, live, now, timeout):
            if service.binder.release(ledger.node, entry.pod_uid, expected=entry):
                released += 1
                service.metrics.rollbacks.labels(reason.value).inc()
                log.info("released %s/%s on %s: %s", entry.namespace, entry.name, ledger.node, reason.value)
            else:
                departing.add(entry.pod_uid)
    service.store.forget_departures(departing)
    if released or readmitting:
        nudge_waiting(service, snapshot)
    return released


def live_pod_facts(api: ClusterApi, entries: tuple[LedgerEntry, ...]) -> dict[str, PodFacts]:
    """What the API says now about each entry's pod, keyed by the entry's pod uid; an entry
    whose pod cannot be read (an API error other than not found) is left out, undecided."""
    out: dict[str, PodFacts] = {}
    for entry in entries:
        try:
            out[entry.pod_uid] = api.read_pod(entry.namespace, entry.name).tracked.facts()
        except ApiNotFound:
            out[entry.pod_uid] = PodFacts(exists=False)
        except ApiError as exc:
            log.warning("cannot confirm %s/%s on its node is stale: %s", entry.namespace, entry.name, exc)
    return out


#: At most this many waiting pods are nudged per pass (oldest known first).
NUDGE_LIMIT = 64


def nudge_waiting(service: ReconciledService, snapshot: ClusterSnapshot) -> int:
    """Tell kube-scheduler that GPUs came back: it does not watch the ledgers, so pods it found
    unschedulable would otherwise wait for an unrelated event (or minutes). Each pending pod the
    extender tracks gets its `linkpack.io/capacity-freed` annotation set (an update the scheduler
    requeues the pod on)."""
    pending = sorted(
        (p for p in snapshot.pods.values() if not p.node_name and not p.finished), key=lambda p: p.key
    )[:NUDGE_LIMIT]
    value = str(next(_nudges))
    for pod in pending:
        service.api.nudge_pod(pod.namespace, pod.name, pod.uid, value)
    return len(pending)


_nudges = itertools.count(int(time.time()))


def run_reconciler(service: ReconciledService, stop: Callable[[], bool], period_s: float = 5.0) -> None:
    while not stop():
        try:
            reconcile_once(service)
        except Exception:  # a bug here must not stop the loop; it is logged with its traceback
            log.exception("reconcile pass failed")
        time.sleep(period_s)
