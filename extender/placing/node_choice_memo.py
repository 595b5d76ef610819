"""The node a filter answer is narrowed to when the pod's policy decides it (`decideNode`),
remembered per node list and re-ranked only where nodes changed.

`topology.node_choice.choose_node` ranks every passing node by `decision_key` against the best
multi-GPU ring bottleneck among them. Between two filter calls for the same node list usually
one node or none changed (the last bind), so `ChoiceMemo` keeps each node's scoring terms and
decision key: a call re-ranks the changed nodes, recomputes all keys only when the best
bottleneck itself moved, and hands out the same (never modified) answer object while neither
the filter answer nor the chosen node changed. The answer is the one `choose_node` gives.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from extender.placing.filter_outcome import FilterOutcome
from extender.placing.reference import narrowed
from topology.node_choice import DecisionKey, NodeChoice, best_bottleneck, decided_by, decision_key
from topology.scoring import RawTerms

#: A passing node's scoring terms for the pod (None when it has none).
TermsOf = Callable[[str], RawTerms | None]


def _link(terms: RawTerms | None) -> float | None:
    return terms.link[0] if terms is not None and terms.link_relative else None


@dataclass
class ChoiceMemo:
    """The last decision over one node list's filter answer (see the module's docstring)."""

    cluster_version: int = -1
    source: FilterOutcome | None = None  # the filter answer decided on
    terms: dict[str, RawTerms | None] = field(default_factory=dict)  # per passing node
    keys: dict[str, DecisionKey] = field(default_factory=dict)  # per passing node with terms
    heap: list[DecisionKey] = field(default_factory=list)  # the keys, lowest first (some stale)
    best: float = 0.0  # the best multi-GPU ring bottleneck among the terms (0.0: none)
    at_best: int = 0  # how many nodes have it
    choice: NodeChoice | None = None  # the chosen node, the runner-up and why (the answer's)
    answer: FilterOutcome | None = None
    #: names that joined or left the node list since the last decision (the list moved)
    listed_changes: set[str] = field(default_factory=set)

    def decide(
        self,
        outcome: FilterOutcome,
        cluster_version: int,
        changed: frozenset[str] | None,
        terms_of: TermsOf,
        passes: Callable[[str], bool],
    ) -> FilterOutcome:
        """`outcome` narrowed to the chosen node. `changed`: the nodes changed since this memo's
        cluster_version (None when unknown: everything is ranked again); `passes`: whether a node is
        among `outcome.passed` (only a changed node, or one that joined or left the list, can have
        started or stopped passing)."""
        if changed is not None and self.listed_changes:
            changed = changed | self.listed_changes
        self.listed_changes = set()
        moved = True
        if changed is None or self.source is None:
            self._rank_all(outcome, terms_of)
        else:
            moved = self._rank_changed(changed, terms_of, passes)
        self.cluster_version = cluster_version
        if not moved and outcome is self.source and self.answer is not None:
            return self.answer  # no node ranked again: the same choice, the same answer
        choice = self._choice()
        if self.answer is None or choice != self.choice or outcome is not self.source:
            self.answer = outcome if choice is None else narrowed(outcome, choice)
        self.source, self.choice = outcome, choice
        return self.answer

    def _choice(self) -> NodeChoice | None:
        """The chosen node and the runner-up, with the step their (current) keys part at."""
        chosen, runner_up = self._lowest_two()
        if chosen is None:
            return None
        chosen_terms = self.terms[chosen]
        assert chosen_terms is not None  # only nodes with terms have keys
        if runner_up is None:
            return NodeChoice(chosen_terms)
        return NodeChoice(
            chosen_terms, self.terms[runner_up], decided_by(self.keys[chosen], self.keys[runner_up])
        )

    def _rank_all(self, outcome: FilterOutcome, terms_of: TermsOf) -> None:
        self.terms = {name: terms_of(name) for name in dict.fromkeys(outcome.passed)}
        self._rekey()

    def _rank_changed(
        self, changed: frozenset[str], terms_of: TermsOf, passes: Callable[[str], bool]
    ) -> bool:
        """Rank again the changed nodes that pass or passed; False when there was none."""
        redo = {name for name in changed if name in self.terms or passes(name)}
        gone = {name for name in redo if not passes(name)}
        redo -= gone
        if not redo and not gone:
            return False
        for name in (*gone, *redo):  # no longer counted among the nodes with the best bottleneck
            if self.best > 0 and _link(self.terms.get(name)) == self.best:
                self.at_best -= 1
        for name in gone:
            del self.terms[name]
            self.keys.pop(name, None)
        for name in redo:
            self.terms[name] = terms_of(name)
        links = [link for name in redo if (link := _link(self.terms[name])) is not None]
        self.at_best += links.count(self.best) if self.best > 0 else 0
        if max(links, default=0.0) > self.best or (self.best > 0 and self.at_best == 0):
            self._rekey()  # the best bottleneck moved: every key is ranked against it
            return True
        for name in redo:
            found = self.terms[name]
            if found is None:
                self.keys.pop(name, None)
            else:
                self.keys[name] = found_key = decision_key(found, self.best)
                heapq.heappush(self.heap, found_key)
        if len(self.heap) > 2 * len(self.keys) + 64:
            self._reheap()
        return True

    def _rekey(self) -> None:
        known = [t for t in self.terms.values() if t is not None]
        self.best = best_bottleneck(known)
        self.at_best = sum(1 for t in known if self.best > 0 and _link(t) == self.best)
        self.keys = {n: decision_key(t, self.best) for n, t in self.terms.items() if t is not None}
        self._reheap()

    def _reheap(self) -> None:
        self.heap = list(self.keys.values())
        heapq.heapify(self.heap)

    def _lowest_two(self) -> tuple[str | None, str | None]:
        """The nodes with the lowest and the next lowest current decision key."""
        chosen = self._lowest()
        if chosen is None:
            return None, None
        top = heapq.heappop(self.heap)
        while self.heap and (self.heap[0][-1] == chosen or self.keys.get(self.heap[0][-1]) != self.heap[0]):
            heapq.heappop(self.heap)  # stale, or a second copy of the chosen node's key
        runner_up = self.heap[0][-1] if self.heap else None
        heapq.heappush(self.heap, top)
        return chosen, runner_up

    def _lowest(self) -> str | None:
        """The node with the lowest current decision key (keys end with the node's name; heap
        entries a node has since been re-keyed from, or that left, are dropped on the way)."""
        while self.heap and self.keys.get(self.heap[0][-1]) != self.heap[0]:
            heapq.heappop(self.heap)
        return self.heap[0][-1] if self.heap else None
