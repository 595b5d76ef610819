"""The last filter answer for one set of node names, kept up to date node by node.

kube-scheduler's node list carries no meaning in its order: its filter runs on many goroutines
and fills the list of feasible nodes in the order they finish, so two calls for the same pods
over the same nodes name them in different orders. And the set itself moves a little between
calls: a node whose GPUs the last binds filled drops out of the list its in-tree filters pass.
So a memo belongs to a *set* of names, an answer names nodes in sorted order whatever order they
were asked in, and a list that differs from a remembered set by a few names updates that memo
(placing only the added names) instead of placing every node again.

The answer objects handed out are never modified: a memo builds a new one when something in it
changed, reusing the last one's passing nodes where it can.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from contract.compute_demand import ComputeDemand
from extender.placing.filter_outcome import FilterOutcome
from extender.placing.node_choice_memo import ChoiceMemo
from topology.scheduling import Misfit, Outcome, Placement

#: A list whose names differ from a remembered set's by at most this share (or this many, when
#: more) updates that memo; more, and the list is placed afresh.
NEAR_SHARE = 8
NEAR_AT_LEAST = 16
_CHOICES_KEPT = 4  # remembered node choices per set (one per CPU and memory demand asked)


@dataclass
class FilterMemo:
    """The filter answer for `names` as of cluster cluster_version `cluster_version`."""

    cluster_version: int
    names: frozenset[str]
    passed: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    misfits: dict[str, Misfit] = field(default_factory=dict)
    answer: FilterOutcome | None = None  # handed out, never changed; None when it must be rebuilt
    previous: FilterOutcome | None = None  # the last answer handed out
    joined: set[str] = field(default_factory=set)  # started passing since `previous`
    left: set[str] = field(default_factory=set)  # stopped passing since `previous`
    #: the node chosen among the passing ones, per the pod's CPU and memory demand (`decideNode`)
    choices: dict[ComputeDemand, ChoiceMemo] = field(default_factory=dict)

    def note(self, name: str, result: Outcome) -> bool:
        """Note where the pod would go on `name` (or why not); True when the answer changed."""
        if isinstance(result, Placement):
            if name in self.passed:
                return False
            self.passed.add(name)
            _move(name, self.left, self.joined)
            self._forget_misfit(name)
            return True
        if self.misfits.get(name) == result:
            return False
        if name in self.passed:
            self.passed.discard(name)
            _move(name, self.joined, self.left)
        self.misfits[name] = result
        (self.failed if result.resolvable else self.unresolvable)[name] = result.message
        (self.unresolvable if result.resolvable else self.failed).pop(name, None)
        return True

    def move_to(self, names: frozenset[str]) -> frozenset[str]:
        """Become the memo of `names`: forget the names no longer asked; returns the names added
        (not yet placed: the caller records them) and tells the node choices what left or came."""
        gone, added = self.names - names, names - self.names
        for name in gone:
            if name in self.passed:
                self.passed.discard(name)
                _move(name, self.joined, self.left)
            self._forget_misfit(name)
        self.names = names
        if gone:
            self.answer = None
        for choice in self.choices.values():
            choice.listed_changes |= gone | added
        return added

    def _forget_misfit(self, name: str) -> None:
        self.failed.pop(name, None)
        self.unresolvable.pop(name, None)
        self.misfits.pop(name, None)

    def choice(self, compute: ComputeDemand) -> ChoiceMemo:
        """The node choice remembered for pods of this CPU and memory demand over these names."""
        found = self.choices.get(compute)
        if found is None:
            if len(self.choices) >= _CHOICES_KEPT:
                self.choices.pop(next(iter(self.choices)))
            found = self.choices[compute] = ChoiceMemo()
        return found

    def current(self) -> FilterOutcome:
        """The answer as the memo stands: the last one while nothing changed, else a new one with
        every bucket in name order (copies: the memo keeps changing while callers keep it)."""
        if self.answer is not None:
            return self.answer
        previous = self.previous
        if previous is None:
            passed = tuple(sorted(self.passed))
        elif self.joined or self.left:
            still = [name for name in previous.passed if name not in self.left]
            for name in self.joined:
                bisect.insort(still, name)
            passed = tuple(still)
        else:
            passed = previous.passed
        self.joined.clear()
        self.left.clear()
        order = sorted(self.misfits)  # the failed and the unresolvable nodes
        failed, unresolvable = self.failed, self.unresolvable
        self.answer = self.previous = FilterOutcome(
            passed,
            {name: failed[name] for name in order if name in failed},
            {name: unresolvable[name] for name in order if name in unresolvable},
            {},
            {name: self.misfits[name] for name in order},
        )
        return self.answer


def nearest(memos: Iterable[FilterMemo], names: frozenset[str]) -> FilterMemo | None:
    """The memo whose set differs least from `names`, if few enough names differ to update it
    (ties: the memo listed first)."""
    limit = max(NEAR_AT_LEAST, len(names) // NEAR_SHARE)
    best: FilterMemo | None = None
    best_apart = limit + 1
    for memo in memos:
        if abs(len(memo.names) - len(names)) >= best_apart:
            continue
        apart = len(memo.names ^ names)
        if apart < best_apart:
            best, best_apart = memo, apart
    return best


def _move(name: str, source: set[str], target: set[str]) -> None:
    """Record that `name` moved out of the passing nodes' `source` side into `target`."""
    if name in source:
        source.discard(name)
    else:
        target.add(name)
