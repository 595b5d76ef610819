"""XID classification, ECC thresholds, recovery timing, root causes and per-GPU cordons."""

from __future__ import annotations

import pytest

from node_agent.health import (
    XID_CATALOG,
    EccThresholds,
    Fault,
    HealthRules,
    HealthTracker,
    Severity,
    classify_xid,
    ecc_fault,
    event_fault,
    unreadable_fault,
)
from node_agent.sources.nvml_reader import EccCounts, EventKind, XidEvent
from tests.node_agent.fakes import FakeClock

U0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000"
U1 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_leave_the_gpu_healthy(xid):
    """XIDs caused by the application leave the GPU healthy."""
    assert classify_xid(xid).severity is Severity.APPLICATION
    assert not classify_xid(xid).severity.marks_unhealthy


@pytest.mark.parametrize("xid", [48, 63, 74, 92, 94, 95, 119, 120])
def test_reset_class_xids(xid):
    """XIDs the catalog answers with a GPU reset need a reset."""
    assert classify_xid(xid).severity is Severity.NEEDS_RESET


@pytest.mark.parametrize("xid", [64, 79])
def test_fatal_xids(xid):
    """Fallen-off-the-bus and failed row remapping are fatal."""
    assert classify_xid(xid).severity is Severity.FATAL


def test_every_catalog_row_has_a_one_line_reason():
    """Every XID in the catalog has a one-line reason."""
    for xid, rule in XID_CATALOG.items():
        assert rule.xid == xid
        assert rule.reason and "\n" not in rule.reason and len(rule.reason) < 110


def test_unknown_xids_need_a_reset_and_overrides_win():
    """An XID missing from the catalog needs a reset, and an operator override wins over the catalog."""
    assert classify_xid(9999).severity is Severity.NEEDS_RESET
    assert "not in the catalog" in classify_xid(9999).reason
    overridden = classify_xid(31, {31: Severity.NEEDS_RESET})
    assert overridden.severity is Severity.NEEDS_RESET
    assert "configuration" in overridden.reason


def test_ecc_events():
    """A double-bit ECC event needs a reset, a single-bit one is only a notice."""
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
    """ECC counters are judged against the default thresholds."""
    fault = ecc_fault(counts, EccThresholds())
    assert (fault.severity if fault else None) is severity


def test_ecc_thresholds_are_configurable():
    """ECC thresholds can be disabled or tightened."""
    limits = EccThresholds(max_volatile_uncorrected=None, max_volatile_corrected=100)
    assert ecc_fault(EccCounts(volatile_uncorrected=9), limits) is None
    fault = ecc_fault(EccCounts(volatile_corrected=101), limits)
    assert fault is not None and "101 correctable" in fault.reason


def _tracker(clock, **policy):
    return HealthTracker([(0, U0), (1, U1)], HealthRules(recheck_after_s=300, **policy), clock)


def test_a_reset_class_fault_recovers_after_a_passing_recheck():
    """A reset-class fault is re-checked after the wait and recovers when the check passes."""
    clock = FakeClock()
    t = _tracker(clock)
    start = clock.now
    _, change = t.observe_xid(XidEvent(0, EventKind.XID, 48))
    assert change is not None and not change.after.healthy
    assert t.get(0).since == start and t.get(0).severity is Severity.NEEDS_RESET
    assert "XID 48" in t.get(0).reason
    clock.advance(299)
    assert t.due_for_recheck() == ()
    clock.advance(1)
    assert t.due_for_recheck() == (0,)
    assert t.observe_recheck(0, passed=False, detail="still bad") is None
    assert t.due_for_recheck() == ()  # waits another full period
    clock.advance(300)
    recovered = t.observe_recheck(0, passed=True)
    assert recovered is not None and recovered.after.healthy
    assert t.get(0).since == clock.now and t.get(0).severity is None
    assert "re-check passed" in t.get(0).reason
    assert t.get(1).healthy


def test_application_faults_change_nothing():
    """An application fault changes nothing in the tracker."""
    t = _tracker(FakeClock())
    fault, change = t.observe_xid(XidEvent(1, EventKind.XID, 13))
    assert fault.severity is Severity.APPLICATION and change is None
    assert t.get(1).healthy


def test_fatal_faults_do_not_recover_unless_configured():
    """Fatal faults are never re-checked unless a fatal re-check delay is configured."""
    clock = FakeClock()
    t = _tracker(clock)
    t.observe_xid(XidEvent(0, EventKind.XID, 79))
    clock.advance(10**6)
    assert t.due_for_recheck() == ()
    clock2 = FakeClock()
    t2 = _tracker(clock2, fatal_recheck_after_s=3600)
    t2.observe_xid(XidEvent(0, EventKind.XID, 79))
    clock2.advance(3600)
    assert t2.due_for_recheck() == (0,)


def test_a_repeated_fault_restarts_the_wait_and_a_worse_one_escalates():
    """A repeated fault restarts the wait, a worse one escalates, and a milder one keeps the reason."""
    clock = FakeClock()
    t = _tracker(clock)
    t.apply_fault(0, Fault(Severity.NEEDS_RESET, "first"))
    since = t.get(0).since
    clock.advance(200)
    assert t.apply_fault(0, Fault(Severity.NEEDS_RESET, "first")) is None  # nothing visible changed
    clock.advance(200)
    assert t.due_for_recheck() == ()  # 400 s after the first, 200 s after the repeat
    change = t.apply_fault(0, Fault(Severity.FATAL, "worse"))
    assert change is not None and t.get(0).severity is Severity.FATAL and t.get(0).since == since
    t.apply_fault(0, Fault(Severity.NEEDS_RESET, "milder"))
    assert t.get(0).reason == "worse"


def test_ecc_counters_feed_the_tracker():
    """ECC counters above their limits mark the GPU unhealthy."""
    t = _tracker(FakeClock())
    assert t.observe_ecc(1, EccCounts(0, 0, 0, 0, False, False)) is None
    change = t.observe_ecc(1, EccCounts(volatile_uncorrected=2))
    assert change is not None and "2 uncorrectable" in change.after.reason


def test_cordons_are_tracked_separately_from_health():
    """Cordons are tracked beside health: a cordoned GPU is healthy but not usable."""
    t = _tracker(FakeClock())
    changes = t.set_cordoned({U1.upper()})
    assert [c.after.index for c in changes] == [1]
    assert t.get(1).cordoned and t.get(1).healthy and not t.get(1).usable
    assert "cordoned" in changes[0].description
    assert t.set_cordoned({U1}) == ()
    assert [c.after.cordoned for c in t.set_cordoned(())] == [False]


def test_a_lost_gpu_after_xid_79_keeps_the_xid_as_its_reason():
    """A GPU that stops answering after XID 79 keeps "XID 79" as the reason on every later poll."""
    t = _tracker(FakeClock())
    t.observe_xid(XidEvent(0, EventKind.XID, 79))
    lost = unreadable_fault("nvmlDeviceGetUUID on GPU 0: GPU is lost (NVML code 15)", gpu_lost=True)
    assert t.apply_fault(0, lost) is None  # nothing visible changes
    assert t.apply_fault(0, lost) is None
    assert t.get(0).reason.startswith("XID 79") and t.get(0).severity is Severity.FATAL


def test_the_xid_replaces_a_gpu_lost_reason_seen_first():
    """When a poll notices the silence before the XID event is handled, the XID still becomes the reason."""
    t = _tracker(FakeClock())
    t.apply_fault(0, unreadable_fault("nvmlDeviceGetUUID on GPU 0: GPU is lost", gpu_lost=True))
    assert t.get(0).reason.startswith("GPU lost")
    _, change = t.observe_xid(XidEvent(0, EventKind.XID, 79))
    assert change is not None and t.get(0).reason.startswith("XID 79")
    t.apply_fault(0, unreadable_fault("nvmlDeviceGetUUID on GPU 0: GPU is lost", gpu_lost=True))
    assert t.get(0).reason.startswith("XID 79")


def test_a_symptom_escalates_the_severity_but_keeps_the_cause():
    """A needs-reset XID followed by a lost GPU is fatal, with the XID still named as the cause."""
    t = _tracker(FakeClock())
    t.observe_xid(XidEvent(1, EventKind.XID, 48))
    change = t.apply_fault(1, unreadable_fault("GPU is lost", gpu_lost=True))
    assert change is not None and t.get(1).severity is Severity.FATAL
    assert t.get(1).reason.startswith("XID 48")


def test_cordons_match_uuids_in_any_letter_case():
    """A cordon written in upper case cordons the GPU whose NVML UUID is lower case, and the other way round."""
    t = _tracker(FakeClock())
    assert [c.after.index for c in t.set_cordoned({"GPU-0A1B2C3D-0000-4000-8000-000000000000"})] == [0]
    assert t.set_cordoned({U0.lower()}) == ()
