"""XID classification, ECC thresholds, recovery timing and the cordon annotation."""

from __future__ import annotations

import pytest

from node_agent.health import (
    XID_CATALOG,
    CordonError,
    EccThresholds,
    Fault,
    HealthPolicy,
    HealthTracker,
    Severity,
    classify_xid,
    ecc_fault,
    event_fault,
    format_cordon_annotation,
    parse_cordon_annotation,
    unknown_cordoned,
)
from node_agent.nvml_reader import EccCounts, EventKind, XidEvent
from tests.node_agent.machines import FakeClock

U0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000"
U1 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_leave_the_gpu_healthy(xid):
    assert classify_xid(xid).severity is Severity.APPLICATION
    assert not classify_xid(xid).severity.marks_unhealthy


@pytest.mark.parametrize("xid", [48, 63, 74, 92, 94, 95, 119, 120])
def test_reset_class_xids(xid):
    assert classify_xid(xid).severity is Severity.NEEDS_RESET


@pytest.mark.parametrize("xid", [64, 79])
def test_fatal_xids(xid):
    assert classify_xid(xid).severity is Severity.FATAL


def test_every_catalog_row_has_a_one_line_reason():
    for xid, rule in XID_CATALOG.items():
        assert rule.xid == xid
        assert rule.reason and "\n" not in rule.reason and len(rule.reason) < 110


def test_unknown_xids_need_a_reset_and_overrides_win():
    assert classify_xid(9999).severity is Severity.NEEDS_RESET
    assert "not in the catalog" in classify_xid(9999).reason
    overridden = classify_xid(31, {31: Severity.NEEDS_RESET})
    assert overridden.severity is Severity.NEEDS_RESET
    assert "configuration" in overridden.reason


def test_ecc_events():
    assert event_fault(XidEvent(0, EventKind.DOUBLE_BIT_ECC)).severity is Severity.NEEDS_RESET
    assert event_fault(XidEvent(0, EventKind.SINGLE_BIT_ECC)).severity is Severity.NOTICE
    assert event_fault(XidEvent(0, EventKind.XID, 79)).xid == 79


@pytest.mark.parametrize(
    ("counts", "severity"),
    [
        (EccCounts(0, 0, 0, 0, False, False), None),
        (EccCounts(), None),  # unsupported counters are not a fault
        (EccCounts(volatile_corrected=5000), None),  # correctable errors are ignored by default
        (EccCounts(volatile_uncorrected=1), Severity.NEEDS_RESET),
        (EccCounts(remap_pending=True), Severity.NEEDS_RESET),
        (EccCounts(volatile_uncorrected=3, remap_failed=True), Severity.FATAL),
    ],
)
def test_ecc_thresholds(counts, severity):
    fault = ecc_fault(counts, EccThresholds())
    assert (fault.severity if fault else None) is severity


def test_ecc_thresholds_are_configurable():
    limits = EccThresholds(max_volatile_uncorrected=None, max_volatile_corrected=100)
    assert ecc_fault(EccCounts(volatile_uncorrected=9), limits) is None
    fault = ecc_fault(EccCounts(volatile_corrected=101), limits)
    assert fault is not None and "101 correctable" in fault.reason


def _tracker(clock, **policy):
    return HealthTracker([(0, U0), (1, U1)], HealthPolicy(recheck_after_s=300, **policy), clock)


def test_a_reset_class_fault_recovers_after_a_passing_recheck():
    clock = FakeClock()
    t = _tracker(clock)
    start = clock.now
    _, change = t.record_event(XidEvent(0, EventKind.XID, 48))
    assert change is not None and not change.after.healthy
    assert t.get(0).since == start and t.get(0).severity is Severity.NEEDS_RESET
    assert "XID 48" in t.get(0).reason
    clock.advance(299)
    assert t.due_for_recheck() == ()
    clock.advance(1)
    assert t.due_for_recheck() == (0,)
    assert t.record_recheck(0, passed=False, detail="still bad") is None
    assert t.due_for_recheck() == ()  # waits another full period
    clock.advance(300)
    recovered = t.record_recheck(0, passed=True)
    assert recovered is not None and recovered.after.healthy
    assert t.get(0).since == clock.now and t.get(0).severity is None
    assert "re-check passed" in t.get(0).reason
    assert t.get(1).healthy


def test_application_faults_change_nothing():
    t = _tracker(FakeClock())
    fault, change = t.record_event(XidEvent(1, EventKind.XID, 13))
    assert fault.severity is Severity.APPLICATION and change is None
    assert t.get(1).healthy


def test_fatal_faults_do_not_recover_unless_configured():
    clock = FakeClock()
    t = _tracker(clock)
    t.record_event(XidEvent(0, EventKind.XID, 79))
    clock.advance(10**6)
    assert t.due_for_recheck() == ()
    clock2 = FakeClock()
    t2 = _tracker(clock2, fatal_recheck_after_s=3600)
    t2.record_event(XidEvent(0, EventKind.XID, 79))
    clock2.advance(3600)
    assert t2.due_for_recheck() == (0,)


def test_a_repeated_fault_restarts_the_wait_and_a_worse_one_escalates():
    clock = FakeClock()
    t = _tracker(clock)
    t.record_fault(0, Fault(Severity.NEEDS_RESET, "first"))
    since = t.get(0).since
    clock.advance(200)
    assert t.record_fault(0, Fault(Severity.NEEDS_RESET, "first")) is None  # nothing visible changed
    clock.advance(200)
    assert t.due_for_recheck() == ()  # 400 s after the first, 200 s after the repeat
    change = t.record_fault(0, Fault(Severity.FATAL, "worse"))
    assert change is not None and t.get(0).severity is Severity.FATAL and t.get(0).since == since
    t.record_fault(0, Fault(Severity.NEEDS_RESET, "milder"))
    assert t.get(0).reason == "worse"


def test_ecc_counters_feed_the_tracker():
    t = _tracker(FakeClock())
    assert t.record_ecc(1, EccCounts(0, 0, 0, 0, False, False)) is None
    change = t.record_ecc(1, EccCounts(volatile_uncorrected=2))
    assert change is not None and "2 uncorrectable" in change.after.reason


def test_cordons_are_tracked_separately_from_health():
    t = _tracker(FakeClock())
    changes = t.set_cordoned({U1.upper()})
    assert [c.after.index for c in changes] == [1]
    assert t.get(1).cordoned and t.get(1).healthy and not t.get(1).usable
    assert "cordoned" in changes[0].description
    assert t.set_cordoned({U1}) == ()
    assert [c.after.cordoned for c in t.set_cordoned(())] == [False]


def test_cordon_annotation_parses_and_normalises():
    assert parse_cordon_annotation(None) == frozenset()
    assert parse_cordon_annotation("  ") == frozenset()
    assert parse_cordon_annotation(f" {U0} , {U1.upper()} ") == {U0, U1}
    assert format_cordon_annotation({U1, U0}) == f"{U0},{U1}"
    assert unknown_cordoned({U0, U1}, [U0]) == (U1,)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (f"{U0},,{U1}", "entry 2 is empty"),
        (f"{U0},", "entry 2 is empty"),
        ("gpu0", "entry 1 'gpu0' is not a GPU UUID; expected GPU-xxxxxxxx"),
        (f"{U0};{U1}", "entry 1 .* is not a GPU UUID"),
        ("MIG-0a1b2c3d-0000-4000-8000-000000000000", "MIG instance; cordon its parent GPU"),
        ("3", "linkpack.io/cordoned-gpus: entry 1 '3'"),
    ],
)
def test_bad_cordon_annotations_are_rejected_clearly(value, message):
    with pytest.raises(CordonError, match=message):
        parse_cordon_annotation(value)
