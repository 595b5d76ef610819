"""The per-node ledger: its JSON form, and which committed entries are stale and why."""

from __future__ import annotations

import pytest

from contract.allocation import Allocation, Enforcement
from contract.ledger import Ledger, LedgerEntry, LedgerError, decode_ledger, encode_ledger
from extender.state.stale_entries import PodFacts, StaleReason, stale_entries
from tests.support.resources import SHARED
from topology.scheduling import GpuGrant

NOW = 10_000.0
TIMEOUT = 120.0


def _entry(uid: str, reserved_at: float = NOW - 10) -> LedgerEntry:
    grant = GpuGrant(1, "GPU-1", False, memory_mib=4096, units=25)
    return LedgerEntry(
        uid,
        "ml",
        f"pod-{uid}",
        Allocation("n1", (grant,), 3, Enforcement.COOPERATIVE, ((SHARED, 25),)),
        reserved_at,
    )


def test_a_ledger_survives_its_configmap_form() -> None:
    ledger = Ledger("n1", (_entry("a"), _entry("b")), "")
    assert decode_ledger("n1", encode_ledger(ledger), "42") == Ledger("n1", ledger.entries, "42")


def test_an_absent_configmap_is_an_empty_ledger() -> None:
    assert decode_ledger("n1", None, "") == Ledger("n1")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"ledger": "{"}, "ledger of n1: data.ledger: not JSON"),
        ({"ledger": '{"schema": "v0"}'}, "unsupported schema 'v0'"),
        ({"ledger": '{"schema": "linkpack.io/ledger/v1", "entries": [{"podUid": "a"}]}'}, "entries\\[0\\]"),
    ],
)
def test_a_malformed_ledger_is_named_precisely(data: dict[str, str], message: str) -> None:
    with pytest.raises(LedgerError, match=message):
        decode_ledger("n1", data, "1")


@pytest.mark.parametrize(
    ("fact", "reserved_at", "reason"),
    [
        (None, NOW - 10, StaleReason.POD_DELETED),
        (PodFacts(True, "other-uid", "n1"), NOW - 10, StaleReason.POD_REPLACED),
        (PodFacts(True, "a", "n1", finished=True), NOW - 10, StaleReason.POD_FINISHED),
        (PodFacts(True, "a", "n2"), NOW - 10, StaleReason.BOUND_ELSEWHERE),
        (PodFacts(True, "a", ""), NOW - TIMEOUT - 1, StaleReason.NEVER_BOUND),
        (PodFacts(True, "a", ""), NOW - 10, None),
        (PodFacts(True, "a", "n1"), NOW - 10_000, None),
    ],
)
def test_stale_entries_are_released_for_the_right_reason(
    fact: PodFacts | None, reserved_at: float, reason: StaleReason | None
) -> None:
    """Deleted, re-created, finished, bound elsewhere or never bound: released; bound here: kept."""
    ledger = Ledger("n1", (_entry("a", reserved_at),), "1")
    facts = {"a": fact} if fact is not None else {}
    found = stale_entries(ledger, facts, NOW, TIMEOUT)
    assert [r for _, r in found] == ([reason] if reason else [])
