"""Filter and prioritize as pure decisions over the cluster state.

`Decider` adds one thing to the pure core: a memo of placements and scoring terms per
(request, policy) and node, valid while the node's state version is unchanged, so that the
thousands of nodes in one call cost a dictionary lookup each unless something on them changed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from extender.pod_requests import PodRequest
from extender.state import ClusterState
from topology.placement import place
from topology.scoring import Ranking, RawTerms, combine, default_fragmentation, node_terms
from topology.workload import Misfit, MisfitReason, Outcome, Placement, Policy, Request

_MAX_REQUEST_KINDS = 512  # distinct (request, policy) pairs remembered at once


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """The three buckets kube-scheduler understands, plus the placement found on each passing node."""

    passed: tuple[str, ...]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    placements: dict[str, Placement] = field(default_factory=dict)
    misfits: dict[str, Misfit] = field(default_factory=dict)


_NO_TOPOLOGY = Misfit(MisfitReason.NO_TOPOLOGY, resolvable=False)


@dataclass
class _FilterMemo:
    """The last filter answer for one node list, and the cluster generation it was true at."""

    generation: int
    names: frozenset[str]
    passed: set[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    misfits: dict[str, Misfit]
    ordered: tuple[str, ...] = ()


class _Memo:
    """Per node: (state version, placement outcome), (state version, scoring terms); per list: filter."""

    __slots__ = ("filters", "outcomes", "rankings", "terms")

    def __init__(self) -> None:
        self.outcomes: dict[str, tuple[int, Outcome]] = {}
        self.terms: dict[str, tuple[int, RawTerms]] = {}
        self.filters: dict[tuple[str, ...], _FilterMemo] = {}
        self.rankings: dict[tuple[str, ...], tuple[int, list[RawTerms | None], Ranking]] = {}


class Decider:
    """Places requests on nodes of a `ClusterState`, remembering results per node version."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._memos: dict[tuple[Request, Policy], _Memo] = {}
        self._lock = threading.Lock()
        self._fragmentation = default_fragmentation()

    def _memo(self, request: Request, policy: Policy) -> _Memo:
        key = (request, policy)
        with self._lock:
            memo = self._memos.get(key)
            if memo is None:
                if len(self._memos) >= _MAX_REQUEST_KINDS:
                    self._memos.pop(next(iter(self._memos)))
                memo = self._memos[key] = _Memo()
            return memo

    def outcome(self, node: str, request: Request, policy: Policy) -> Outcome:
        """Where `request` would go on `node` now (or why it cannot)."""
        memo = self._memo(request, policy)
        (version,) = self._state.node_versions((node,))
        return self._outcome(memo, node, version, request, policy)

    def _outcome(self, memo: _Memo, node: str, version: int, request: Request, policy: Policy) -> Outcome:
        hit = memo.outcomes.get(node)
        if hit is not None and hit[0] == version:
            return hit[1]
        state = self._state.node_state(node)
        result: Outcome = _NO_TOPOLOGY if state is None else place(state, request, policy)
        memo.outcomes[node] = (version, result)
        return result

    def filter(self, pod: PodRequest, node_names: Sequence[str]) -> FilterOutcome:
        """Which nodes fit; only nodes changed since the same list was last asked are re-placed."""
        memo = self._memo(pod.request, pod.policy)
        key = tuple(node_names)
        found = memo.filters.get(key)
        generation, changed = self._state.changes_since(found.generation if found else 0)
        if found is None or changed is None:
            found = self._full_filter(memo, key, pod, generation)
        elif changed:
            self._refresh(memo, found, changed & found.names, pod)
            found.generation = generation
        if not found.ordered or changed:
            found.ordered = tuple(n for n in key if n in found.passed)
        # copies: the memo keeps changing while callers (the explain log) keep this answer
        return FilterOutcome(
            found.ordered, dict(found.failed), dict(found.unresolvable), {}, dict(found.misfits)
        )

    def _full_filter(
        self, memo: _Memo, key: tuple[str, ...], pod: PodRequest, generation: int
    ) -> _FilterMemo:
        found = _FilterMemo(generation, frozenset(key), set(), {}, {}, {})
        self._refresh(memo, found, key, pod)
        if len(memo.filters) >= 4:
            memo.filters.pop(next(iter(memo.filters)))
        memo.filters[key] = found
        return found

    def _refresh(self, memo: _Memo, found: _FilterMemo, names: Iterable[str], pod: PodRequest) -> None:
        names = tuple(names)
        versions = self._state.node_versions(names)
        for name, version in zip(names, versions, strict=True):
            result = self._outcome(memo, name, version, pod.request, pod.policy)
            found.failed.pop(name, None)
            found.unresolvable.pop(name, None)
            found.misfits.pop(name, None)
            if isinstance(result, Placement):
                found.passed.add(name)
            else:
                found.passed.discard(name)
                found.misfits[name] = result
                (found.failed if result.resolvable else found.unresolvable)[name] = result.message

    def prioritize(self, pod: PodRequest, node_names: Sequence[str]) -> Ranking:
        """Scores for the nodes; only nodes changed since the same list was last scored are redone."""
        memo = self._memo(pod.request, pod.policy)
        key = tuple(node_names)
        found = memo.rankings.get(key)
        generation, changed = self._state.changes_since(found[0] if found else 0)
        if found is not None and changed is not None and not changed:
            return found[2]
        if found is None or changed is None:
            positions = list(range(len(key)))
            terms: list[RawTerms | None] = [None] * len(key)
        else:
            terms = found[1]
            positions = [i for i, n in enumerate(key) if n in changed]
        names = [key[i] for i in positions]
        for i, name, version in zip(positions, names, self._state.node_versions(names), strict=True):
            terms[i] = self._terms(memo, name, version, pod)
        ranking = combine([t for t in terms if t is not None], pod.policy)
        if found is None and len(memo.rankings) >= 4:
            memo.rankings.pop(next(iter(memo.rankings)))
        memo.rankings[key] = (generation, terms, ranking)
        return ranking

    def _terms(self, memo: _Memo, name: str, version: int, pod: PodRequest) -> RawTerms | None:
        hit = memo.terms.get(name)
        if hit is not None and hit[0] == version:
            return hit[1]
        state = self._state.node_state(name)
        result = self._outcome(memo, name, version, pod.request, pod.policy)
        if state is None or not isinstance(result, Placement):
            return None
        found = node_terms(state, result, pod.request, pod.policy, self._fragmentation)
        memo.terms[name] = (version, found)
        return found
