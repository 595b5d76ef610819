"""The device plugin's memory between kubelet calls: what was handed out, and writing it back.

`AllocationBroker` keeps the handout state under one lock; every decision is made by the pure
functions in `request_matching`, `records`, `reconcile` and `container_spec`. Write-backs onto the pods
(`PodRecordStore`) happen outside the lock and are retried on the next `reconcile()` when they
fail. A container gets the enforcement and compute priority its record says; when this node
cannot apply the level now (MPS not serving, the interposer library missing) the share is held
cooperatively, which is logged and counted in `enforcement_disagreements` and, by the record's
level, in `fallbacks`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from contract.allocation import Allocation, Consumption
from contract.handoff import NodeHolds
from contract.pods import PodRef
from node_agent.deviceplugin.container_spec import ContainerSpec, SharingConfig, container_spec
from node_agent.deviceplugin.holds import kubelet_active, kubelet_holding, node_holds, report_holds
from node_agent.deviceplugin.inventory import Inventory
from node_agent.deviceplugin.reconcile import KubeletAssignment, Reconciliation, Rewrite, reconcile
from node_agent.deviceplugin.record_store import BoundPod, PodRecordStore, RecordStoreError
from node_agent.deviceplugin.records import PodRecord, RecordProblem, read_records
from node_agent.deviceplugin.request_matching import (
    HandoutState,
    RecordKey,
    candidates,
    choose_slot,
    consume,
    consumption_of,
    fit_within_record,
    forget_handout,
    lost_handout,
    preferred_ids,
    release_departed,
    resync,
)
from node_agent.sharing.interposer_delivery import interposer_installed
from node_agent.sharing.mps import mps_active

log = logging.getLogger(__name__)

#: The kubelet's pod-resources account of our devices; raises OSError when it cannot be asked.
KubeletAccount = Callable[[], Sequence[KubeletAssignment]]


class AllocationRefused(Exception):
    """The kubelet's request cannot be served; the message is what the kubelet (and the pod) sees."""


@dataclass
class BrokerCounters:
    allocations: int = 0
    refusals: int = 0
    id_mismatches: int = 0  # the kubelet passed other devices than the record's
    enforcement_disagreements: int = 0  # the node could not apply the record's enforcement
    fallbacks: dict[str, int] = field(default_factory=dict)  # of those, by the record's level
    applied: dict[str, int] = field(default_factory=dict)  # handouts by the level applied
    swaps: int = 0
    unresolved: int = 0  # distinct cases the kubelet's account could not be squared with
    adopted: int = 0
    write_failures: int = 0


class AllocationBroker:
    def __init__(
        self,
        inventory: Inventory,
        store: PodRecordStore,
        sharing: SharingConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        departure_grace_s: float = 60.0,
        mps_ready: Callable[[], bool] | None = None,
        kubelet_account: KubeletAccount | None = None,
        holds_refresh_s: float = 5.0,
    ) -> None:
        """`mps_ready`: whether MPS serves this node now, asked at each share handout (default: the
        configured pipe directory exists, `node_agent.sharing.mps`). `kubelet_account`: the kubelet's
        pod-resources List; with it departed pods release at once when the kubelet no longer holds
        them (else after `departure_grace_s`), a request that no record fits is retried after
        such a release, and `holds()` reports what the node holds (`contract.handoff`)."""
        self.inventory = inventory
        self.sharing = sharing or SharingConfig()
        self._mps_ready = mps_ready or (lambda: mps_active(self.sharing.mps_pipe_dir))
        self.counters = BrokerCounters()
        self._store = store
        self._clock = clock
        self._grace_s = departure_grace_s
        self._last_kubelet: Sequence[KubeletAssignment] | None = None  # its account at the last fresh look
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._state = HandoutState()
        self._overrides: dict[str, Allocation] = {}
        self._pending_consumed: dict[RecordKey, tuple[PodRef, Consumption]] = {}
        self._pending_rewrites: dict[str, Rewrite] = {}
        self._reported: set[tuple[str, int, str]] = set()
        self._unresolved_seen: set[str] = set()
        self.kubelet_account = kubelet_account
        self._holds_refresh_s = holds_refresh_s
        self._holds: NodeHolds | None = None
        self._holds_at = 0.0
        self._draining = False
        #: whether every plugin is registered with the kubelet now (set by the plugin watcher)
        self.registered = True

    @property
    def state(self) -> HandoutState:
        with self._lock:
            return self._state

    def resync(self) -> None:
        """Rebuild what was handed out from the consumed annotations (call once at start)."""
        with self._lock:
            records = self._records(self._list())
            self._state = resync(records, self._clock())

    def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...]:
        with self._lock:
            try:
                records = self._records(self._list())
            except RecordStoreError as exc:
                log.warning("cannot read this node's pods, preferring no record's devices: %s", exc)
                records = ()
            if not candidates(resource, size, records, self._state, self.inventory):
                records = self._refreshed(records)
            return preferred_ids(
                resource, available, must_include, size, records, self._state, self.inventory
            )

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerSpec:
        """What the container asking for these devices gets; AllocationRefused when no record fits."""
        with self._lock:
            try:
                records = self._records(self._list())
            except RecordStoreError as exc:
                self.counters.refusals += 1
                raise AllocationRefused(f"cannot read this node's pods: {exc}") from exc
            slot = choose_slot(resource, device_ids, records, self._state, self.inventory)
            if slot is None:
                records = self._refreshed(records)
                slot = choose_slot(resource, device_ids, records, self._state, self.inventory)
            if slot is None and self._last_kubelet is not None:
                slot = lost_handout(
                    resource, device_ids, records, self._state, kubelet_holding(self._last_kubelet)
                )
                if slot is not None:
                    log.info(
                        "the kubelet asks again for %s of %s (it lost the first answer)", resource, slot.pod
                    )
                    self._state = forget_handout(self._state, slot)
            if slot is None:
                self.counters.refusals += 1
                raise AllocationRefused(
                    f"no Linkpack allocation record on this node asks for {len(device_ids)} {resource} "
                    "with GPUs that are free; was the pod scheduled through the Linkpack extender?"
                )
            record = next(r for r in records if r.ref.uid == slot.pod.uid)
            slot = fit_within_record(slot, record, device_ids, self._state)
            self._state = consume(self._state, record, slot, device_ids, self._clock())
            handout = self._state.handouts[-1]
            key = (record.ref.uid, record.allocation.generation)
            self._pending_consumed[key] = (record.ref, consumption_of(self._state, key))
            spec = container_spec(
                slot.grants,
                self.inventory,
                self.sharing,
                record.allocation.enforcement,
                mps_ready=self._mps_ready(),
                interposer_ready=interposer_installed(self.sharing.interposer_host_dir),
                priority=record.allocation.priority,
            )
            self.counters.allocations += 1
            applied = self.counters.applied
            applied[spec.enforcement.value] = applied.get(spec.enforcement.value, 0) + 1
            self._report_disagreements(record, spec, handout.ids_agree, list(device_ids), slot.container)
        self._flush()
        return spec

    def reconcile(self, kubelet: Sequence[KubeletAssignment] | None = None) -> Reconciliation | None:
        """Release what departed pods held, retry write-backs, and check our handouts against the
        kubelet's own account when it is available (given, or else asked through
        `kubelet_account` after the pods were listed). Returns what the check found, and updates
        `holds()`. Raises RecordStoreError when the pods cannot be listed (nothing is changed then)."""
        outcome: Reconciliation | None = None
        with self._lock:
            pods = self._list()
            revision = self._listing_revision()
            if kubelet is None:
                kubelet = self._ask_kubelet()
            now = self._clock()
            active = kubelet_active(kubelet) if kubelet is not None else None
            self._state = release_departed(self._state, (p.ref.uid for p in pods), now, self._grace_s, active)
            present = {p.ref.uid for p in pods}
            self._overrides = {uid: a for uid, a in self._overrides.items() if uid in present}
            if kubelet is not None:
                outcome = reconcile(self._state, self._records(pods), kubelet, now)
                self._apply(outcome)
                if revision is not None:
                    uids = {(p.ref.namespace, p.ref.name): p.ref.uid for p in pods}
                    admitting = self.registered and not self._draining
                    current = node_holds(revision, kubelet, self._state, uids, self.inventory, admitting)
                    self._holds, self._holds_at = report_holds(
                        self._holds, self._holds_at, current, now, self._holds_refresh_s
                    )
            elif self.kubelet_account is not None and self._holds is not None:
                # the kubelet cannot be asked (restarting?): keep what it held, take no new pods
                self._holds = replace(self._holds, admitting=False)
        self._flush()
        return outcome

    def kubelet_unreachable(self) -> None:
        """The kubelet does not answer (restarting?): keep what it held, report no new pods."""
        with self._lock:
            if self._holds is not None and self._holds.admitting:
                self._holds = replace(self._holds, admitting=False)

    def begin_drain(self) -> None:
        """Stop taking new pods (reported in `holds()`): the plugins are about to stop."""
        with self._lock:
            self._draining = True
            previous = self._holds or NodeHolds("")
            self._holds = replace(previous, admitting=False)

    def wait_admitted(self, timeout_s: float, at_least_s: float) -> bool:
        """Wait (at least `at_least_s`, at most `timeout_s`) until every pod bound here with a
        record is in the kubelet's account (admitted) or gone; whether that happened."""
        started = self._clock()
        while True:
            pending = self._not_admitted()
            elapsed = self._clock() - started
            if (pending == 0 and elapsed >= at_least_s) or elapsed >= timeout_s:
                return pending == 0
            time.sleep(0.2)

    def _not_admitted(self) -> int:
        try:
            pods = self._list()
        except RecordStoreError:
            return 0
        kubelet = self._ask_kubelet()
        if kubelet is None:
            return 0
        active = kubelet_active(kubelet)
        with self._lock:
            records = self._records(pods)
        return sum(1 for r in records if (r.ref.namespace, r.ref.name) not in active)

    def holds(self) -> NodeHolds | None:
        """What the node holds as last reported (None: not known, e.g. no pod-resources socket)."""
        with self._lock:
            return self._holds

    def _listing_revision(self) -> str | None:
        revision = getattr(self._store, "listing_revision", None)
        return revision() if callable(revision) else None

    def _ask_kubelet(self) -> Sequence[KubeletAssignment] | None:
        if self.kubelet_account is None:
            return None
        try:
            return self.kubelet_account()
        except OSError as exc:
            log.info("pod-resources unavailable: %s", exc)
            return None

    def _refreshed(self, records: tuple[PodRecord, ...]) -> tuple[PodRecord, ...]:
        """Records and state after a fresh look, when a request fits no record: the pods are
        listed again and whatever the kubelet no longer holds for departed pods is released."""
        try:
            pods = self._list()
        except RecordStoreError:
            return records
        kubelet = self._ask_kubelet()
        self._last_kubelet = kubelet
        if kubelet is not None:
            self._state = release_departed(
                self._state, (p.ref.uid for p in pods), self._clock(), self._grace_s, kubelet_active(kubelet)
            )
        return self._records(pods)

    def _apply(self, outcome: Reconciliation) -> None:
        self._state = outcome.state
        self._overrides.update(dict(outcome.overrides))
        for rewrite in outcome.rewrites:
            self._pending_rewrites[rewrite.pod.uid] = rewrite
            self._pending_consumed = {
                k: v for k, v in self._pending_consumed.items() if k[0] != rewrite.pod.uid
            }
        self.counters.swaps += len(outcome.swapped)
        self.counters.adopted += outcome.adopted
        for owner, taker in outcome.swapped:
            log.warning("kubelet gave %s's record to %s; swapped the two records", owner, taker)
        for why in outcome.unresolved:
            if why not in self._unresolved_seen:  # the same case shows up on every reconcile
                self._unresolved_seen.add(why)
                self.counters.unresolved += 1
                log.error("cannot reconcile with the kubelet: %s", why)

    def _list(self) -> Sequence[BoundPod]:
        return self._store.list_bound_pods_on_node()

    def _records(self, pods: Sequence[BoundPod]) -> tuple[PodRecord, ...]:
        records, problems = read_records(pods, self.inventory, self._overrides)
        for problem in problems:
            self._report_problem(problem)
        return records

    def _report_problem(self, problem: RecordProblem) -> None:
        key = (problem.pod.uid, problem.generation, problem.reason)
        if key not in self._reported:
            self._reported.add(key)
            log.error("allocation record of %s cannot be used: %s", problem.pod, problem.reason)

    def _report_disagreements(
        self, record: PodRecord, spec: ContainerSpec, ids_agree: bool, device_ids: list[str], container: str
    ) -> None:
        if not ids_agree:
            self.counters.id_mismatches += 1
            log.warning(
                "kubelet chose %s for %s container %s; the record says otherwise, the container gets the record's",
                device_ids,
                record.ref,
                container,
            )
        if spec.fallback:
            self.counters.enforcement_disagreements += 1
            recorded = record.allocation.enforcement.value
            self.counters.fallbacks[recorded] = self.counters.fallbacks.get(recorded, 0) + 1
            log.warning(
                "%s container %s gets weaker enforcement than its record: %s",
                record.ref,
                container,
                spec.fallback,
            )

    def _flush(self) -> None:
        """Write back rewritten records, then consumed annotations (outside the state lock). A
        consumed annotation waits while its pod's rewritten record is not in the API yet."""
        with self._write_lock:
            with self._lock:
                rewrites = dict(self._pending_rewrites)
            unwritten: set[str] = set()
            for uid, rw in rewrites.items():
                outcome = self._write(
                    f"record of {rw.pod}",
                    self._store.rewrite_allocation,
                    rw.pod,
                    rw.replaces,
                    rw.allocation,
                    rw.consumption,
                )
                if outcome == "retry":
                    unwritten.add(uid)
                    continue
                with self._lock:
                    if self._pending_rewrites.get(uid) == rw:
                        del self._pending_rewrites[uid]
                    if outcome == "moot" and self._overrides.get(uid) == rw.allocation:
                        del self._overrides[uid]  # the API's record is newer than ours
            with self._lock:
                consumed = {k: v for k, v in self._pending_consumed.items() if k[0] not in unwritten}
            for key, (pod, consumption) in consumed.items():
                outcome = self._write(f"consumed of {pod}", self._store.mark_consumed, pod, consumption)
                if outcome != "retry":
                    with self._lock:
                        if self._pending_consumed.get(key) == (pod, consumption):
                            del self._pending_consumed[key]

    def _write(self, what: str, call: Callable[..., bool], *args: object) -> Literal["done", "moot", "retry"]:
        """done; moot when the pod is gone or its record changed meanwhile; retry after a failure."""
        try:
            if call(*args):
                return "done"
            log.info("skipped writing %s: the pod is gone or its record changed", what)
            return "moot"
        except RecordStoreError as exc:
            self.counters.write_failures += 1
            log.warning("writing %s failed, will retry: %s", what, exc)
            return "retry"
        except Exception:
            self.counters.write_failures += 1
            log.exception("writing %s failed unexpectedly, will retry", what)
            return "retry"
