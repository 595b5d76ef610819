"""Releases capacity that is committed but will never be used.

A ledger entry is stale when its pod was deleted, re-created, finished, bound to another node,
or never bound within the reservation timeout (an extender that crashed between commit and
Binding leaves such an entry). Deciding is pure (`extender.stale_entries`); this loop
only applies the decisions through the binder's release path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from extender.service import ExtenderService
from extender.stale_entries import stale_entries

log = logging.getLogger("linkpack.extender.reconciler")


def reconcile_once(service: ExtenderService, now: float | None = None) -> int:
    """Release every stale entry once; returns how many were released."""
    snapshot = service.store.snapshot()
    if not snapshot.is_synced(("ledgers", "pods")):
        return 0
    now = time.time() if now is None else now
    released = 0
    for ledger in snapshot.ledgers():
        facts = snapshot.pod_facts(e.pod_uid for e in ledger.entries)
        for entry, reason in stale_entries(ledger, facts, now, service.config.reservation_timeout_s):
            if service.binder.release(ledger.node, entry.pod_uid):
                released += 1
                service.metrics.rollbacks.labels(reason.value).inc()
                log.info("released %s/%s on %s: %s", entry.namespace, entry.name, ledger.node, reason.value)
    return released


def run_reconciler(service: ExtenderService, stop: Callable[[], bool], period_s: float = 5.0) -> None:
    while not stop():
        try:
            reconcile_once(service)
        except Exception:  # a bug here must not stop the loop; it is logged with its traceback
            log.exception("reconcile pass failed")
        time.sleep(period_s)
