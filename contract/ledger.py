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
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.allocation import (
    Allocation,
    AllocationError,
    decode_allocation,
    encode_allocation,
    load_json_object,
)
from contract.keys import ledger_node
from topology.scheduling import GpuGrant

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
    doc = load_json_object(data["ledger"], f"ledger of {node}: data.ledger", LedgerError)
    if doc.get("schema") != LEDGER_SCHEMA:
        raise LedgerError(f"ledger of {node}: unsupported schema {str(doc.get('schema'))[:60]!r}")
    raw_entries = doc.get("entries") or []
    if not isinstance(raw_entries, list):
        raise LedgerError(f"ledger of {node}: entries: expected a list, got {type(raw_entries).__name__}")
    entries = [_entry(node, position, raw) for position, raw in enumerate(raw_entries)]
    return Ledger(node, _sorted(entries), resource_version)


def _entry(node: str, position: int, raw: object) -> LedgerEntry:
    where = f"ledger of {node}: entries[{position}]"
    if not isinstance(raw, dict):
        raise LedgerError(f"{where}: expected an object, got {type(raw).__name__}")
    texts = {}
    for key in ("podUid", "namespace", "name", "allocation"):
        value = raw.get(key)
        if not isinstance(value, str):
            raise LedgerError(f"{where}.{key}: expected a string, got {type(value).__name__}")
        texts[key] = value
    reserved_at = raw.get("reservedAt")
    if isinstance(reserved_at, bool) or not isinstance(reserved_at, (int, float)):
        raise LedgerError(f"{where}.reservedAt: expected seconds since the epoch, got {reserved_at!r:.40}")
    try:
        seconds = float(reserved_at)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise LedgerError(f"{where}.reservedAt: {str(reserved_at)[:40]} is not a time")
    try:
        allocation = decode_allocation(texts["allocation"])
    except AllocationError as exc:
        raise LedgerError(f"{where}.allocation: {exc}") from exc
    return LedgerEntry(texts["podUid"], texts["namespace"], texts["name"], allocation, seconds)


def ledger_from_config_map(obj: Mapping[str, Any]) -> Ledger:
    """A ledger from its ConfigMap as JSON (the node comes from the ConfigMap's name)."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise LedgerError(f"ledger of ?: metadata: expected an object, got {type(meta).__name__}")
    node = ledger_node(str(meta.get("name") or ""))
    data = obj.get("data")
    if data is not None and not isinstance(data, Mapping):
        raise LedgerError(f"ledger of {node}: data is not an object")
    return decode_ledger(node, data, str(meta.get("resourceVersion") or ""))


def _sorted(entries: Iterable[LedgerEntry]) -> tuple[LedgerEntry, ...]:
    return tuple(sorted(entries, key=lambda e: (e.reserved_at, e.pod_uid)))
