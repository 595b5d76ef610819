"""Filter and prioritize as pure decisions over one cluster snapshot.

`Decider` adds one thing to the pure core: a memo of placements and scoring terms per
(request, policy) and node, valid while the node's state version is unchanged, so that the
thousands of nodes in one call cost a dictionary lookup each unless something on them changed.
Every call decides on the one `ClusterSnapshot` it is given; the memo of one request kind is
locked while a call uses it, so calls may run on several threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from contract.compute_demand import ComputeDemand
from extender.placing.filter_memo import FilterMemo, nearest
from extender.placing.filter_outcome import FilterOutcome as FilterOutcome  # where callers have found it
from extender.placing.reference import NO_TOPOLOGY, driver_misfit, scoring_terms
from extender.state.pod_requests import PodRequest
from extender.state.snapshot import ClusterSnapshot
from extender.state.store import ClusterStore
from topology.placement import place
from topology.scheduling import Outcome, Policy, Request
from topology.scoring import (
    Ranking,
    RawTerms,
    combine,
    default_fragmentation,
)

_MAX_REQUEST_KINDS = 512  # distinct (request, policy) pairs remembered at once
_LISTS_KEPT = 4  # node lists whose set of names is remembered per request kind
_MAX_TERMS = 200_000  # scoring terms remembered per request kind (node x pod CPU/memory)


class _Memo:
    """Per node: (state version, placement outcome), (state version, scoring terms); per list: filter.

    Everything in it was decided against one learned workload (`workload_version`); a new one
    empties it."""

    __slots__ = ("cuda", "filters", "lock", "outcomes", "rankings", "sets", "terms", "workload_version")

    def __init__(self, cuda: str = "") -> None:
        self.cuda = cuda  # the CUDA version the request needs of a node's driver ("" any)
        self.lock = threading.Lock()
        self.workload_version = -1
        self.outcomes: dict[str, tuple[int, Outcome]] = {}
        self.terms: dict[tuple[str, ComputeDemand], tuple[int, RawTerms]] = {}
        self.filters: dict[frozenset[str], FilterMemo] = {}
        #: the set of names of the last few lists asked, as asked: a list asked again in the same
        #: order finds its set (and through it its memo) by the list alone, without building and
        #: comparing a new set of thousands of names
        self.sets: dict[tuple[str, ...], frozenset[str]] = {}
        self.rankings: dict[
            tuple[ComputeDemand, tuple[str, ...]], tuple[int, list[RawTerms | None], Ranking]
        ] = {}

    def align(self, snapshot: ClusterSnapshot) -> None:
        """Forget what was decided against another learned workload than the snapshot's."""
        if snapshot.workload_version != self.workload_version:
            self.workload_version = snapshot.workload_version
            self.outcomes.clear()
            self.terms.clear()
            self.filters.clear()
            self.sets.clear()
            self.rankings.clear()


class Decider:
    """Places requests on nodes of cluster snapshots, remembering results per node version."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._memos: dict[tuple[Request, Policy, str], _Memo] = {}
        self._lock = threading.Lock()
        self._fragmentation = default_fragmentation()

    def _memo(self, request: Request, policy: Policy, cuda: str = "") -> _Memo:
        key = (request, policy, cuda)
        with self._lock:
            memo = self._memos.get(key)
            if memo is None:
                if len(self._memos) >= _MAX_REQUEST_KINDS:
                    self._memos.pop(next(iter(self._memos)))
                memo = self._memos[key] = _Memo(cuda)
            return memo

    def outcome(
        self, snapshot: ClusterSnapshot, node: str, request: Request, policy: Policy, cuda: str = ""
    ) -> Outcome:
        """Where `request` would go on `node` in this snapshot (or why it cannot)."""
        memo = self._memo(request, policy, cuda)
        with memo.lock:
            memo.align(snapshot)
            return self._outcome(snapshot, memo, node, request, policy)

    def _outcome(
        self, snapshot: ClusterSnapshot, memo: _Memo, node: str, request: Request, policy: Policy
    ) -> Outcome:
        version = snapshot.version(node)
        hit = memo.outcomes.get(node)
        if hit is not None and hit[0] == version:
            return hit[1]
        entry = snapshot.node(node)
        state = entry.state if entry is not None else None
        result: Outcome
        if state is None or entry is None or entry.published is None:
            result = NO_TOPOLOGY
        else:
            result = driver_misfit(memo.cuda, entry.published.status) or place(
                state, request, policy, snapshot.workload
            )
        memo.outcomes[node] = (version, result)
        return result

    def filter(self, snapshot: ClusterSnapshot, pod: PodRequest, node_names: Sequence[str]) -> FilterOutcome:
        """Which nodes fit; only nodes changed since the same names were last asked are re-placed
        (`extender.placing.filter_memo`: the order asked carries no meaning, and a list that moved by a
        few names places only those). Every bucket of the answer is in name order.

        When the pod's policy decides the node (`decideNode`) and several fit, only the one
        `topology.node_choice.choose_node` picks passes; the others fail naming it (for the
        explain log: the answer on the wire names the chosen node alone, see
        `ExtenderService.filter`). While none
        of the nodes changed, the same (never modified) answer object is handed out again."""
        memo = self._memo(pod.request, pod.policy, pod.cuda_version)
        key = node_names if isinstance(node_names, tuple) else tuple(node_names)
        with memo.lock:
            memo.align(snapshot)
            names = memo.sets.get(key)
            if names is None:
                if len(memo.sets) >= _LISTS_KEPT:
                    memo.sets.pop(next(iter(memo.sets)))
                names = memo.sets[key] = frozenset(key)
            found = self._filter(snapshot, memo, pod, names)
            answer = found.current()
            if not pod.decide_node or len(answer.passed) < 2:
                return answer
            return self._decide(snapshot, memo, pod, found, answer)

    def _decide(
        self,
        snapshot: ClusterSnapshot,
        memo: _Memo,
        pod: PodRequest,
        listed: FilterMemo,
        outcome: FilterOutcome,
    ) -> FilterOutcome:
        """`outcome` narrowed to the node `choose_node` picks among its passing nodes, re-ranking
        only the nodes changed since the list was last decided (`ChoiceMemo`)."""
        found = listed.choice(pod.compute)
        cluster_version = snapshot.cluster_version
        changed = (
            self._store.changes_between(found.cluster_version, cluster_version) if found.source else None
        )
        return found.decide(
            outcome,
            cluster_version,
            changed,
            lambda name: self._terms(snapshot, memo, name, pod),
            listed.passed.__contains__,
        )

    def _filter(
        self, snapshot: ClusterSnapshot, memo: _Memo, pod: PodRequest, names: frozenset[str]
    ) -> FilterMemo:
        """The memo of these names, up to date: the one remembered, or a near one moved to them,
        or a new one."""
        cluster_version = snapshot.cluster_version
        found = memo.filters.get(names)
        added: frozenset[str] = frozenset()
        if found is None:
            found = nearest(memo.filters.values(), names)
            if found is not None:
                del memo.filters[found.names]
                added = found.move_to(names)
                memo.filters[names] = found
        changed = self._store.changes_between(found.cluster_version, cluster_version) if found else None
        if found is None or changed is None:
            return self._full_filter(snapshot, memo, names, pod)
        touched = (changed & names) | added
        if touched and self._refresh(snapshot, memo, found, touched, pod):
            found.answer = None
        found.cluster_version = cluster_version
        return found

    def _full_filter(
        self, snapshot: ClusterSnapshot, memo: _Memo, names: frozenset[str], pod: PodRequest
    ) -> FilterMemo:
        found = FilterMemo(snapshot.cluster_version, names)
        self._refresh(snapshot, memo, found, sorted(names), pod)
        memo.filters.pop(names, None)
        if len(memo.filters) >= 4:
            memo.filters.pop(next(iter(memo.filters)))
        memo.filters[names] = found
        return found

    def _refresh(
        self,
        snapshot: ClusterSnapshot,
        memo: _Memo,
        found: FilterMemo,
        names: Iterable[str],
        pod: PodRequest,
    ) -> bool:
        """Place `names` again; True when the filter answer for them changed."""
        moved = False
        for name in names:
            moved |= found.note(name, self._outcome(snapshot, memo, name, pod.request, pod.policy))
        return moved

    def prioritize(self, snapshot: ClusterSnapshot, pod: PodRequest, node_names: Sequence[str]) -> Ranking:
        """Scores for the nodes; only nodes changed since the same list was last scored are redone."""
        memo = self._memo(pod.request, pod.policy, pod.cuda_version)
        with memo.lock:
            memo.align(snapshot)
            return self._prioritize(snapshot, memo, pod, tuple(node_names))

    def _prioritize(
        self, snapshot: ClusterSnapshot, memo: _Memo, pod: PodRequest, key: tuple[str, ...]
    ) -> Ranking:
        memo_key = (pod.compute, key)
        found = memo.rankings.get(memo_key)
        cluster_version = snapshot.cluster_version
        changed = self._store.changes_between(found[0], cluster_version) if found else None
        if found is not None and changed is not None and not changed:
            return found[2]
        if found is None or changed is None:
            positions = list(range(len(key)))
            terms: list[RawTerms | None] = [None] * len(key)
        else:
            terms = found[1]
            positions = [i for i, n in enumerate(key) if n in changed]
        for i in positions:
            terms[i] = self._terms(snapshot, memo, key[i], pod)
        ranking = combine([t for t in terms if t is not None], pod.policy)
        if found is None and len(memo.rankings) >= 4:
            memo.rankings.pop(next(iter(memo.rankings)))
        memo.rankings[memo_key] = (cluster_version, terms, ranking)
        return ranking

    def _terms(self, snapshot: ClusterSnapshot, memo: _Memo, name: str, pod: PodRequest) -> RawTerms | None:
        version = snapshot.version(name)
        memo_key = (name, pod.compute)
        hit = memo.terms.get(memo_key)
        if hit is not None and hit[0] == version:
            return hit[1]
        found = scoring_terms(
            snapshot,
            name,
            pod,
            self._outcome(snapshot, memo, name, pod.request, pod.policy),
            self._fragmentation,
        )
        if found is None:
            return None
        if len(memo.terms) >= _MAX_TERMS:
            memo.terms.clear()
        memo.terms[memo_key] = (version, found)
        return found
