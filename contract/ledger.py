"""The per-node allocation ledger: the API object that makes GPU accounting race-free.

Each GPU node has one ledger (a ConfigMap `linkpack-ledger-<node>` in the extender's
namespace). A bind commits its allocation by rewriting the ledger with a resourceVersion
precondition, so two binders (two extender replicas, a restarted extender, a second scheduler)
can never both commit the same capacity: one of them gets 409 Conflict, re-reads and re-plans.
The pod then carries the same record in its `linkpack.io/allocation` annotation.

This module is pure: the types and their JSON form. Only the extender writes ledgers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.allocation import Allocation, AllocationError, decode_allocation, encode_allocation
from contract.keys import ledger_node
from topology.workload import GpuGrant

LEDGER_SCHEMA = "linkpack.io/ledger/v1"


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


def ledger_from_config_map(obj: Mapping[str, Any]) -> Ledger:
    """A ledger from its ConfigMap as JSON (the node comes from the ConfigMap's name)."""
    meta = obj.get("metadata") or {}
    node = ledger_node(str(meta.get("name") or ""))
    data = obj.get("data")
    if data is not None and not isinstance(data, Mapping):
        raise LedgerError(f"ledger of {node}: data is not an object")
    return decode_ledger(node, data, str(meta.get("resourceVersion") or ""))


def _sorted(entries: Iterable[LedgerEntry]) -> tuple[LedgerEntry, ...]:
    return tuple(sorted(entries, key=lambda e: (e.reserved_at, e.pod_uid)))
