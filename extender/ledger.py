"""The per-node allocation ledger: the API object that makes GPU accounting race-free.

Each GPU node has one ledger (a ConfigMap `linkpack-ledger-<node>` in the extender's
namespace). A bind commits its allocation by rewriting the ledger with a resourceVersion
precondition, so two binders (two extender replicas, a restarted extender, a second scheduler)
can never both commit the same capacity: one of them gets 409 Conflict, re-reads and re-plans.
The pod then carries the same record in its `linkpack.io/allocation` annotation.

This module is pure: the types, their JSON form, and the decisions about stale entries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from topology.allocation import Allocation, AllocationError, decode_allocation, encode_allocation
from topology.workload import GpuGrant

LEDGER_SCHEMA = "linkpack.io/ledger/v1"
LEDGER_LABEL = "linkpack.io/ledger"
LEDGER_PREFIX = "linkpack-ledger-"


def ledger_name(node: str) -> str:
    return f"{LEDGER_PREFIX}{node}"


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One pod's committed allocation on this node; `reserved_at` is unix seconds."""

    pod_uid: str
    namespace: str
    name: str
    allocation: Allocation
    reserved_at: float


@dataclass(frozen=True, slots=True)
class Ledger:
    """All allocations committed on one node, and the API version they were read at."""

    node: str
    entries: tuple[LedgerEntry, ...] = ()
    resource_version: str = ""

    def by_uid(self) -> dict[str, LedgerEntry]:
        return {e.pod_uid: e for e in self.entries}

    def grants(self) -> Iterable[GpuGrant]:
        for entry in self.entries:
            yield from entry.allocation.grants

    def with_entry(self, entry: LedgerEntry) -> Ledger:
        kept = tuple(e for e in self.entries if e.pod_uid != entry.pod_uid)
        return Ledger(self.node, _sorted((*kept, entry)), self.resource_version)

    def without(self, uids: Iterable[str]) -> Ledger:
        gone = set(uids)
        return Ledger(
            self.node, tuple(e for e in self.entries if e.pod_uid not in gone), self.resource_version
        )


class LedgerError(ValueError):
    """A ledger object in the API is malformed; the message names the node and the field."""


def encode_ledger(ledger: Ledger) -> dict[str, str]:
    """The ConfigMap `data` for a ledger."""
    doc = {
        "schema": LEDGER_SCHEMA,
        "node": ledger.node,
        "entries": [
            {
                "podUid": e.pod_uid,
                "namespace": e.namespace,
                "name": e.name,
                "reservedAt": e.reserved_at,
                "allocation": encode_allocation(e.allocation),
            }
            for e in ledger.entries
        ],
    }
    return {"ledger": json.dumps(doc, sort_keys=True, separators=(",", ":"))}


def decode_ledger(node: str, data: Mapping[str, str] | None, resource_version: str) -> Ledger:
    """A ledger from its ConfigMap `data`; an absent or empty map is an empty ledger."""
    if not data or "ledger" not in data:
        return Ledger(node, (), resource_version)
    try:
        doc = json.loads(data["ledger"])
    except json.JSONDecodeError as exc:
        raise LedgerError(f"ledger of {node}: not JSON ({exc.msg})") from exc
    if not isinstance(doc, dict) or doc.get("schema") != LEDGER_SCHEMA:
        raise LedgerError(
            f"ledger of {node}: unsupported schema {doc.get('schema') if isinstance(doc, dict) else doc!r}"
        )
    entries = []
    for position, raw in enumerate(doc.get("entries") or []):
        try:
            entries.append(
                LedgerEntry(
                    pod_uid=str(raw["podUid"]),
                    namespace=str(raw["namespace"]),
                    name=str(raw["name"]),
                    allocation=decode_allocation(str(raw["allocation"])),
                    reserved_at=float(raw["reservedAt"]),
                )
            )
        except (KeyError, TypeError, ValueError, AllocationError) as exc:
            raise LedgerError(f"ledger of {node}: entries[{position}]: {exc}") from exc
    return Ledger(node, _sorted(entries), resource_version)


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


def _sorted(entries: Iterable[LedgerEntry]) -> tuple[LedgerEntry, ...]:
    return tuple(sorted(entries, key=lambda e: (e.reserved_at, e.pod_uid)))
