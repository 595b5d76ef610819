"""When a committed ledger entry will never be used and its capacity goes back (pure rules).

A ledger entry is stale when its pod was deleted, re-created, finished, bound to another node,
or never bound within the reservation timeout (an extender that crashed between commit and
Binding leaves such an entry). `extender.binding.reconciler` applies these decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from contract.ledger import Ledger, LedgerEntry


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the cluster says about a ledger entry's pod right now."""

    exists: bool
    uid: str = ""
    node_name: str = ""
    finished: bool = False  # Succeeded / Failed: its GPUs are free again


class StaleReason(StrEnum):
    POD_DELETED = "pod deleted"
    POD_REPLACED = "pod re-created with another uid"
    POD_FINISHED = "pod finished"
    BOUND_ELSEWHERE = "pod bound to another node"
    NEVER_BOUND = "pod not bound within the reservation timeout"


def stale_entries(
    ledger: Ledger, facts: Mapping[str, PodFacts], now: float, reservation_timeout_s: float
) -> tuple[tuple[LedgerEntry, StaleReason], ...]:
    """Entries whose capacity should be released, with why. `facts` is keyed by pod uid."""
    out = []
    for entry in ledger.entries:
        fact = facts.get(entry.pod_uid, PodFacts(exists=False))
        reason: StaleReason | None = None
        if not fact.exists:
            reason = StaleReason.POD_DELETED
        elif fact.uid and fact.uid != entry.pod_uid:
            reason = StaleReason.POD_REPLACED
        elif fact.finished:
            reason = StaleReason.POD_FINISHED
        elif fact.node_name and fact.node_name != ledger.node:
            reason = StaleReason.BOUND_ELSEWHERE
        elif not fact.node_name and now - entry.reserved_at > reservation_timeout_s:
            reason = StaleReason.NEVER_BOUND
        if reason is not None:
            out.append((entry, reason))
    return tuple(out)
