"""Bind: commit the final GPU choice to the node's ledger, then bind the pod carrying it.

The order makes over-allocation impossible whatever else runs at the same time:
1. read the pod fresh (uid must match, not yet bound elsewhere);
2. plan on the node's ledger as the API holds it, commit with a resourceVersion precondition
   (a 409 means someone else committed first: re-read, re-plan);
3. create the Binding with uid + resourceVersion preconditions, carrying the allocation
   annotation so the pod and its record land in one atomic update;
4. on any failure after the commit, remove the entry again so the capacity is free.

Binds to one node that arrive together are committed as a group (`extender.binding.group_commit`):
their pods are planned one after the other on one copy of the node's ledger, which is then
written once with the same precondition, and each pod goes on to its own Binding. A conflict
re-plans the whole group on the fresh ledger.

Any number of extender replicas may do this at once (active-active): every ledger change is a
compare-and-swap on the API's copy, never on a replica's cached view. An entry an earlier
attempt left for the same pod (perhaps by a replica that died before binding) is renewed with
a compare-and-swap before it is used, so a replica releasing it as never bound either wins
first (the renewal conflicts and the pod is placed afresh) or loses (the release sees the
renewed entry and keeps it): a pod is never bound on capacity the ledger has given back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from contract.allocation import Allocation, encode_allocation, enforcement_for
from contract.keys import ALLOCATION_ANNOTATION
from contract.ledger import Ledger, LedgerEntry
from contract.node_state import build_node_state
from extender.binding.group_commit import GroupCommit
from extender.config import ExtenderConfig
from extender.placing.reference import driver_misfit
from extender.state.cluster_api import ApiConflict, ApiError, ApiNotFound, ClusterApi
from extender.state.pod_requests import PodRequest, RequestError, read_pod_request, scheduler_mismatch
from extender.state.store import ClusterStore
from topology.placement import place
from topology.scheduling import Misfit, MisfitReason


@dataclass(frozen=True, slots=True)
class BindResult:
    """Empty `error` means bound; `allocation` is what the pod got (None for non-GPU pods)."""

    error: str = ""
    allocation: Allocation | None = None
    attempts: int = 0
    rolled_back: bool = False


@dataclass(frozen=True, slots=True)
class PendingBind:
    """One pod waiting for its node's next group commit."""

    pod: PodRequest
    already_bound: bool  # bound to the node already: record it, do not bind again


@dataclass(frozen=True, slots=True)
class Committed:
    """The pod's entry is in the node's ledger (`written`: by this commit; else it was already)."""

    entry: LedgerEntry
    attempts: int
    written: bool


class Binder:
    def __init__(
        self,
        api: ClusterApi,
        store: ClusterStore,
        config: ExtenderConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._store = store
        self._config = config
        self._clock = clock
        self._group: GroupCommit[PendingBind, Committed | BindResult] = GroupCommit(self.commit_batch)

    @property
    def group(self) -> GroupCommit[PendingBind, Committed | BindResult]:
        """The per-node group commit (its counters tell how many binds shared a write)."""
        return self._group

    def bind(
        self, namespace: str, name: str, uid: str, node: str, known: PodRequest | None = None
    ) -> BindResult:
        """Bind the pod to `node` with its GPUs. `known` is the request parsed at filter time for
        this very pod (same uid): extended-resource requests cannot change, so the pod need not
        be read again, and the Binding's uid precondition still guards against a re-created pod."""
        if not uid:
            return BindResult(
                error=f"bind of {namespace}/{name} names no pod UID; kube-scheduler always sends one"
            )
        if known is not None and known.pod.uid == uid:
            return self._gpu_bind(known, "", node, already_bound=False)
        try:
            pod = self._api.read_pod(namespace, name)
        except ApiNotFound:
            return BindResult(error=f"pod {namespace}/{name} no longer exists")
        except ApiError as exc:
            return BindResult(error=f"reading pod {namespace}/{name}: {exc}")
        if pod.tracked.uid != uid:
            return BindResult(
                error=f"pod {namespace}/{name} was re-created (uid {pod.tracked.uid}, expected {uid})"
            )
        if pod.tracked.node_name and pod.tracked.node_name != node:
            return BindResult(error=f"pod {namespace}/{name} is already bound to {pod.tracked.node_name}")
        wrong_scheduler = scheduler_mismatch(pod.manifest, self._config.scheduler_name)
        if wrong_scheduler:
            return BindResult(error=wrong_scheduler)
        parsed = read_pod_request(pod.manifest, self._config, self._store.snapshot().book)
        if isinstance(parsed, RequestError):
            return BindResult(error=parsed.message)
        if parsed is None:
            # kube-scheduler delegates binding only for pods asking for a managed resource; the
            # extender's binding right is not lent to anything else
            return BindResult(
                error=f"pod {namespace}/{name} asks for no GPU resource; the extender binds only GPU pods"
            )
        return self._gpu_bind(parsed, pod.resource_version, node, pod.tracked.node_name == node)

    def _gpu_bind(self, pod: PodRequest, pod_rv: str, node: str, already_bound: bool) -> BindResult:
        outcome = self._group.submit(node, PendingBind(pod, already_bound))
        if isinstance(outcome, BindResult):
            return outcome
        if already_bound:
            return BindResult(allocation=outcome.entry.allocation, attempts=outcome.attempts)
        return self._bind_or_roll_back(pod, pod_rv, node, outcome.entry, outcome.attempts)

    def commit_batch(self, node: str, batch: Sequence[PendingBind]) -> list[Committed | BindResult]:
        """Commit the ledger entries of `batch` (binds to `node`) in one compare-and-swap write.

        The pods are planned in order on one copy of the ledger, each seeing the ones before it;
        a pod that no longer fits gets its Misfit and the others go on. A conflict re-plans the
        whole batch on the fresh ledger. An entry an earlier attempt left for a pod is renewed
        (or, for a pod already bound, kept as it is)."""
        ledger = self._store.snapshot().ledger(node)
        for attempt in range(1, self._config.bind_retries + 1):
            working = ledger
            outcomes: list[Committed | BindResult] = []
            fresh: list[str] = []  # uids whose new entries this attempt announced to the store
            for pending in batch:
                uid = pending.pod.pod.uid
                existing = working.by_uid().get(uid)
                if existing is not None and pending.already_bound:
                    outcomes.append(Committed(existing, attempt, written=False))
                    continue
                if existing is not None:
                    entry = replace(existing, reserved_at=self._clock())
                else:
                    planned = self._plan(pending.pod, working)
                    if isinstance(planned, Misfit):
                        outcomes.append(BindResult(error=f"node {node}: {planned.message}", attempts=attempt))
                        continue
                    entry = planned
                    self._store.begin_bind(node, uid, entry.allocation.grants)
                    fresh.append(uid)
                working = working.with_entry(entry)
                outcomes.append(Committed(entry, attempt, written=True))
            if not any(isinstance(o, Committed) and o.written for o in outcomes):
                return outcomes
            try:
                ledger = self._api.write_ledger(working)
            except ApiConflict:
                self._end_binds(node, fresh)
                ledger = self._fresh_ledger(node, ledger)
                continue
            except ApiError as exc:
                self._end_binds(node, fresh)
                failed = BindResult(error=f"committing allocation on {node}: {exc}", attempts=attempt)
                return [failed if isinstance(o, Committed) and o.written else o for o in outcomes]
            self._store.apply_ledger(ledger)
            return outcomes
        gave_up = BindResult(
            error=f"node {node}: gave up after {self._config.bind_retries} conflicting commits"
        )
        return [gave_up for _ in batch]

    def _end_binds(self, node: str, uids: Sequence[str]) -> None:
        for uid in uids:
            self._store.end_bind(node, uid)

    def _plan(self, pod: PodRequest, ledger: Ledger) -> LedgerEntry | Misfit:
        """Place on the node as its ledger stands (not counting other binds in flight: the
        ledger's compare-and-swap settles those), with the node's own cordons and health."""
        node = self._store.snapshot().node(ledger.node)
        if node is None or node.published is None:
            return Misfit(MisfitReason.NO_TOPOLOGY, resolvable=False)
        facts = node.facts
        node_state, _ = build_node_state(
            node.published,
            ledger.grants(),
            self._config.units_per_gpu,
            facts.cordons if facts is not None else None,
            facts.unschedulable if facts is not None else False,
        )
        outcome = driver_misfit(pod.cuda_version, node.published.status) or place(
            node_state, pod.request, pod.policy
        )
        if isinstance(outcome, Misfit):
            return outcome
        allocation = Allocation(
            node=ledger.node,
            grants=outcome.grants,
            generation=1,
            # decided once, from what the node publishes about itself, and recorded for the node
            enforcement=enforcement_for(
                outcome.grants, node.mps_active, node.interposer_available, pod.interposer_opt_out
            ),
            priority=pod.priority,
            resources=pod.resources,
        )
        return LedgerEntry(pod.pod.uid, pod.pod.namespace, pod.pod.name, allocation, self._clock())

    def _fresh_ledger(self, node: str, fallback: Ledger) -> Ledger:
        try:
            return self._api.read_ledger(node)
        except ApiError:
            return fallback

    def _bind_or_roll_back(
        self, pod: PodRequest, pod_rv: str, node: str, entry: LedgerEntry, attempts: int
    ) -> BindResult:
        annotations = {ALLOCATION_ANNOTATION: encode_allocation(entry.allocation)}
        try:
            self._api.bind(pod.pod.namespace, pod.pod.name, pod.pod.uid, pod_rv, node, annotations)
        except ApiError as exc:
            if self._bound_anyway(pod, node):
                # e.g. the reply was lost after the API server bound it: keep the commit
                return BindResult(allocation=entry.allocation, attempts=attempts)
            rolled_back = self.release(node, pod.pod.uid)
            return BindResult(
                error=f"binding {pod.pod.key} to {node}: {exc}", attempts=attempts, rolled_back=rolled_back
            )
        return BindResult(allocation=entry.allocation, attempts=attempts)

    def _bound_anyway(self, pod: PodRequest, node: str) -> bool:
        """After a failed Binding call: is this very pod bound to `node` nevertheless?"""
        try:
            current = self._api.read_pod(pod.pod.namespace, pod.pod.name)
        except ApiError:
            return False
        return current.tracked.uid == pod.pod.uid and current.tracked.node_name == node

    def release(self, node: str, uid: str, expected: LedgerEntry | None = None) -> bool:
        """Remove `uid`'s entry from the node's ledger (retrying on conflicts); True when gone.

        With `expected`, only that very entry goes: if the ledger holds a different one for the
        pod (a bind renewed or replaced it meanwhile), it is kept and the answer is False."""
        self._store.end_bind(node, uid)
        ledger = self._store.snapshot().ledger(node)
        for _ in range(self._config.bind_retries * 2):
            current = ledger.by_uid().get(uid)
            if current is None:
                return True
            if expected is not None and current != expected:
                return False
            try:
                ledger = self._api.write_ledger(ledger.without([uid]))
                self._store.apply_ledger(ledger)
                return True
            except ApiConflict:
                ledger = self._fresh_ledger(node, ledger)
            except ApiError:
                return False
        return False
