"""GPU health: XID classification, ECC thresholds, a recovering state machine, per-GPU cordon.

Everything here is pure: the tracker never reads NVML or the clock by itself (the clock is
injected), so its timing is tested without waiting.

Policy, following the actions of NVIDIA's XID catalog rather than "any XID is fatal":
- APPLICATION XIDs are the application's own fault (bad kernel, bad address); the GPU stays
  healthy and the XID is only counted.
- NEEDS_RESET takes the GPU out of service; after `recheck_after_s` the agent re-checks it
  (readable, ECC clean, no pending row remap) and puts it back when the check passes. This is
  the recovery path existing device plugins lack (they need a restart).
- FATAL takes the GPU out of service for good by default (`fatal_recheck_after_s=None`):
  fallen off the bus, row-remap failure. A node reboot (agent restart) clears it.

The reason shown for an unhealthy GPU names its root cause. A GPU that stops answering NVML
is a symptom (`Fault.symptom`): after XID 79 every later poll finds the GPU unreadable, and
that must not replace "XID 79" with "GPU lost". So a symptom never replaces the reason of a
cause, a cause replaces a symptom's reason (the event may be handled after the poll that
noticed the silence), and between faults of one kind the first of the worst severity stays.
The severity is always the worst seen.

Which GPUs are cordoned comes from the node annotation, read by `contract.cordons`; the
tracker only records it beside the health.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from contract.cordons import canonical_gpu_uuid
from node_agent.sources.nvml_reader import EccCounts, EventKind, XidEvent


class Severity(StrEnum):
    APPLICATION = "application"  # the application's fault; the GPU stays healthy
    NOTICE = "notice"  # worth counting and logging; no action on the GPU
    NEEDS_RESET = "needs-reset"  # out of service until a reset and a passing re-check
    FATAL = "fatal"  # out of service until an operator acts (by default)

    @property
    def marks_unhealthy(self) -> bool:
        return self in (Severity.NEEDS_RESET, Severity.FATAL)

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.APPLICATION: 0, Severity.NOTICE: 1, Severity.NEEDS_RESET: 2, Severity.FATAL: 3}


@dataclass(frozen=True, slots=True)
class XidRule:
    xid: int
    severity: Severity
    reason: str


def _rules(*rows: tuple[int, Severity, str]) -> Mapping[int, XidRule]:
    return MappingProxyType({xid: XidRule(xid, sev, why) for xid, sev, why in rows})


_A, _N, _R, _F = Severity.APPLICATION, Severity.NOTICE, Severity.NEEDS_RESET, Severity.FATAL

#: Our reading of NVIDIA's XID catalog (immediate actions), one line of reason per XID.
XID_CATALOG: Mapping[int, XidRule] = _rules(
    (8, _A, "a channel stopped making progress; the catalog's first action is restarting the app"),
    (13, _A, "graphics engine exception: illegal instruction or bad address in the app's kernel"),
    (31, _A, "GPU memory page fault: the app touched an address it does not own"),
    (32, _R, "corrupted push buffer stream from the host: PCIe or driver trouble, not the app"),
    (38, _R, "driver firmware error: the GPU's firmware state is suspect until reset"),
    (43, _A, "the app's channel was reset after its own fault; other work is unaffected"),
    (44, _R, "graphics engine fault during a context switch: engine state is suspect"),
    (45, _A, "preemptive cleanup after an earlier error (the app was killed or exited)"),
    (46, _R, "GPU stopped processing: the engine hangs until the GPU is reset"),
    (48, _R, "double-bit ECC error: data was lost; reset to retire or remap the memory"),
    (61, _R, "internal micro-controller breakpoint/warning: firmware state is suspect"),
    (62, _R, "internal micro-controller halted: the GPU needs a reset"),
    (63, _R, "row remapping / page retirement recorded: a reset activates the remap"),
    (64, _F, "row remapping / page retirement failed: the memory cannot be repaired in place"),
    (68, _A, "video decoder (NVDEC) exception raised by the app's stream"),
    (69, _A, "graphics engine class error: the app sent an invalid method"),
    (74, _R, "NVLink error: a link is degraded or down; peer paths are unreliable until reset"),
    (79, _F, "GPU has fallen off the bus: the GPU is gone until the node is rebooted"),
    (92, _R, "high single-bit ECC error rate: memory is degrading; take it out and re-check"),
    (94, _R, "contained uncorrectable ECC error: the affected app died; reset to remap rows"),
    (95, _R, "uncontained uncorrectable ECC error: every app on the GPU is affected; reset it"),
    (109, _A, "context switch timeout, usually a long-running or hung app kernel"),
    (119, _R, "GSP RPC timeout: the GPU system processor stopped answering the driver"),
    (120, _R, "GSP error: the GPU system processor faulted; reset the GPU"),
    (121, _R, "C2C link error between the CPU and the GPU (Grace Hopper class)"),
    (140, _R, "uncorrectable ECC error the driver could not recover from"),
    (154, _N, "the driver changed its recommended recovery action; logged for operators"),
)

#: What an XID missing from the table counts as: out of service, but recoverable.
UNKNOWN_XID_SEVERITY = Severity.NEEDS_RESET


def classify_xid(xid: int, overrides: Mapping[int, Severity] | None = None) -> XidRule:
    """The rule for an XID; `overrides` (operator config) win over the catalog."""
    rule = XID_CATALOG.get(xid)
    if overrides and xid in overrides:
        reason = rule.reason if rule else "unlisted XID"
        return XidRule(xid, overrides[xid], f"{reason} (severity set by configuration)")
    if rule is not None:
        return rule
    return XidRule(xid, UNKNOWN_XID_SEVERITY, "XID not in the catalog table; treated as needing a reset")


@dataclass(frozen=True, slots=True)
class EccThresholds:
    """When ECC counters make a GPU unhealthy. None disables a check."""

    max_volatile_uncorrected: int | None = 0
    max_aggregate_uncorrected: int | None = None
    max_volatile_corrected: int | None = None
    remap_pending_needs_reset: bool = True
    remap_failure_is_fatal: bool = True


@dataclass(frozen=True, slots=True)
class Fault:
    """Something wrong with one GPU, with how bad it is and why.

    `symptom` is set for a GPU that does not answer NVML: a consequence of some cause (an XID,
    a lost bus) rather than a cause of its own."""

    severity: Severity
    reason: str
    xid: int | None = None
    symptom: bool = False


def event_fault(event: XidEvent, overrides: Mapping[int, Severity] | None = None) -> Fault:
    """What a driver event means for the GPU."""
    if event.kind is EventKind.DOUBLE_BIT_ECC:
        return Fault(Severity.NEEDS_RESET, "double-bit ECC error event")
    if event.kind is EventKind.SINGLE_BIT_ECC:
        return Fault(Severity.NOTICE, "single-bit ECC error event (corrected)")
    rule = classify_xid(event.xid, overrides)
    return Fault(rule.severity, f"XID {event.xid}: {rule.reason}", event.xid)


def ecc_fault(counts: EccCounts, limits: EccThresholds) -> Fault | None:
    """The worst ECC problem in `counts`, or None when the counters are within limits."""
    if limits.remap_failure_is_fatal and counts.remap_failed:
        return Fault(Severity.FATAL, "row remapping failed: memory cannot be repaired in place")
    checks = (
        (counts.volatile_uncorrected, limits.max_volatile_uncorrected, "uncorrectable ECC errors since boot"),
        (counts.aggregate_uncorrected, limits.max_aggregate_uncorrected, "lifetime uncorrectable ECC errors"),
        (counts.volatile_corrected, limits.max_volatile_corrected, "correctable ECC errors since boot"),
    )
    for value, limit, what in checks:
        if value is not None and limit is not None and value > limit:
            return Fault(Severity.NEEDS_RESET, f"{value} {what} (limit {limit})")
    if limits.remap_pending_needs_reset and counts.remap_pending:
        return Fault(Severity.NEEDS_RESET, "row remapping pending: a GPU reset activates it")
    return None


def unreadable_fault(detail: str, gpu_lost: bool) -> Fault:
    """The GPU did not answer NVML (a symptom: see the module docstring)."""
    if gpu_lost:
        return Fault(Severity.FATAL, f"GPU lost: {detail}", symptom=True)
    return Fault(Severity.NEEDS_RESET, f"GPU unreadable: {detail}", symptom=True)


@dataclass(frozen=True, slots=True)
class HealthRules:
    recheck_after_s: float = 300.0
    fatal_recheck_after_s: float | None = None  # None: FATAL never recovers on its own
    ecc: EccThresholds = EccThresholds()
    xid_overrides: Mapping[int, Severity] = field(default_factory=dict)

    def recheck_delay(self, severity: Severity) -> float | None:
        return self.fatal_recheck_after_s if severity is Severity.FATAL else self.recheck_after_s


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health as published. `since` is when `healthy` last changed (clock seconds)."""

    index: int
    uuid: str
    healthy: bool = True
    reason: str = ""
    since: float = 0.0
    severity: Severity | None = None
    cordoned: bool = False
    next_recheck: float | None = None
    reason_is_symptom: bool = False  # the reason is a symptom's; a cause may still replace it

    @property
    def usable(self) -> bool:
        return self.healthy and not self.cordoned


@dataclass(frozen=True, slots=True)
class HealthChange:
    before: GpuHealth
    after: GpuHealth

    @property
    def description(self) -> str:
        a = self.after
        name = f"GPU {a.index} ({a.uuid})"
        if self.before.cordoned != a.cordoned:
            return f"{name} {'cordoned' if a.cordoned else 'uncordoned'}"
        if not a.healthy:
            return f"{name} unhealthy [{a.severity}]: {a.reason}"
        return f"{name} healthy again: {a.reason}"


class HealthTracker:
    """Per-GPU health state machine: healthy -> unhealthy (fault) -> healthy (re-check passed)."""

    def __init__(
        self,
        gpus: Sequence[tuple[int, str]],
        policy: HealthRules | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy or HealthRules()
        self._clock = clock
        now = clock()
        self._state = {index: GpuHealth(index, uuid, since=now) for index, uuid in gpus}

    def current(self) -> tuple[GpuHealth, ...]:
        return tuple(self._state[i] for i in sorted(self._state))

    def get(self, index: int) -> GpuHealth:
        return self._state[index]

    def apply_fault(self, index: int, fault: Fault) -> HealthChange | None:
        """Apply a fault. Faults that do not mark a GPU unhealthy change nothing."""
        if index not in self._state or not fault.severity.marks_unhealthy:
            return None
        now = self._clock()
        cur = self._state[index]
        delay = self.policy.recheck_delay(fault.severity)
        next_recheck = now + delay if delay is not None else None
        if cur.healthy:
            new = replace(
                cur,
                healthy=False,
                reason=fault.reason,
                since=now,
                severity=fault.severity,
                next_recheck=next_recheck,
                reason_is_symptom=fault.symptom,
            )
        else:
            assert cur.severity is not None
            severity = fault.severity if fault.severity.rank > cur.severity.rank else cur.severity
            delay = self.policy.recheck_delay(severity)
            takes_reason = _replaces_reason(cur, fault)
            new = replace(
                cur,
                reason=fault.reason if takes_reason else cur.reason,
                severity=severity,
                next_recheck=now + delay if delay is not None else None,
                reason_is_symptom=fault.symptom if takes_reason else cur.reason_is_symptom,
            )
        return self._commit(cur, new)

    def observe_xid(self, event: XidEvent) -> tuple[Fault, HealthChange | None]:
        fault = event_fault(event, self.policy.xid_overrides)
        return fault, self.apply_fault(event.gpu_index, fault)

    def observe_ecc(self, index: int, counts: EccCounts) -> HealthChange | None:
        fault = ecc_fault(counts, self.policy.ecc)
        return self.apply_fault(index, fault) if fault is not None else None

    def due_for_recheck(self) -> tuple[int, ...]:
        """Unhealthy GPUs whose re-check time has come."""
        now = self._clock()
        return tuple(
            h.index
            for h in self.current()
            if not h.healthy and h.next_recheck is not None and h.next_recheck <= now
        )

    def observe_recheck(self, index: int, passed: bool, detail: str = "") -> HealthChange | None:
        """The outcome of re-checking a GPU: back to healthy, or wait another period."""
        cur = self._state.get(index)
        if cur is None or cur.healthy:
            return None
        now = self._clock()
        if passed:
            was = f"{cur.reason}" if cur.reason else "earlier fault"
            new = replace(
                cur,
                healthy=True,
                reason=f"re-check passed after: {was}",
                since=now,
                severity=None,
                next_recheck=None,
                reason_is_symptom=False,
            )
            return self._commit(cur, new)
        assert cur.severity is not None
        delay = self.policy.recheck_delay(cur.severity)
        self._state[index] = replace(cur, next_recheck=now + delay if delay is not None else None)
        return None

    def set_cordoned(self, uuids: Iterable[str]) -> tuple[HealthChange, ...]:
        """Mark exactly these GPUs (by UUID, in any letter case) cordoned; returns the GPUs whose
        cordon changed."""
        wanted = frozenset(canonical_gpu_uuid(u) for u in uuids)
        changes = []
        for cur in self.current():
            cordoned = canonical_gpu_uuid(cur.uuid) in wanted
            if cordoned != cur.cordoned:
                change = self._commit(cur, replace(cur, cordoned=cordoned))
                if change is not None:
                    changes.append(change)
        return tuple(changes)

    def _commit(self, cur: GpuHealth, new: GpuHealth) -> HealthChange | None:
        self._state[cur.index] = new
        visible = (cur.healthy, cur.reason, cur.severity, cur.cordoned) != (
            new.healthy,
            new.reason,
            new.severity,
            new.cordoned,
        )
        return HealthChange(cur, new) if visible else None


def _replaces_reason(cur: GpuHealth, fault: Fault) -> bool:
    """Whether a new fault's reason replaces the reason of an unhealthy GPU: a cause beats a
    symptom, a symptom never beats a cause, and otherwise only a strictly worse fault does."""
    assert cur.severity is not None
    if fault.symptom != cur.reason_is_symptom:
        return not fault.symptom
    return fault.severity.rank > cur.severity.rank
