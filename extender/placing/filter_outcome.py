"""What filter decides for one pod over a node list, in the buckets kube-scheduler understands."""

from __future__ import annotations

from dataclasses import dataclass, field

from topology.node_choice import NodeChoice
from topology.scheduling import Misfit, Placement


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """The three buckets kube-scheduler understands, plus the placement found on each passing node.

    `extender.placing.decisions.Decider` hands out the same outcome again while none of the nodes it
    covers changed, and callers keep it (the explain log): it is never modified."""

    passed: tuple[str, ...]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    placements: dict[str, Placement] = field(default_factory=dict)
    misfits: dict[str, Misfit] = field(default_factory=dict)
    #: For an answer narrowed to the one node the policy chose: the answer it was narrowed from
    #: (its other passing nodes are the ones `failed` adds, each naming the chosen node).
    narrowed_from: FilterOutcome | None = None
    #: For a narrowed answer: the chosen node's and the runner-up's terms, and what told them
    #: apart (for the explain log; not on the wire).
    choice: NodeChoice | None = None
