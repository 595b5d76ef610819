"""Filter and prioritize in plain words: the rules, with no memo and no reuse. Read this first.

For one pod (`PodRequest`) over the node names kube-scheduler sends, on one `ClusterSnapshot`:

1. **Where would the pod go on each node?** (`node_outcome`) A node with no published topology
   cannot take a GPU pod; a node whose driver is older than the CUDA version the pod needs cannot
   either; otherwise `topology.placement.place` finds the GPUs (or the share, or the MIG slice) on
   it, or says why none fit (`Misfit`, with a reason and whether waiting could help).
2. **Filter** (`filter_nodes`): the nodes with a placement pass; the rest fail with their
   reason, resolvable misfits as `FailedNodes` and the others as `FailedAndUnresolvableNodes`.
   When the pod's policy decides the node (`decideNode`) and several pass, the one
   `topology.node_choice.choose_node` picks is the only one that passes (`narrowed`); the
   answer keeps the runner-up and the step of the ranking that told them apart, for explain.
3. **Prioritize** (`prioritize_nodes`): each node with a placement gets its scoring terms
   (`topology.scoring.node_terms`: link quality, fragmentation, packing, CPU balance), and the
   policy's weights mix them into a 0..10 score (`combine`).

`extender.placing.decisions.Decider` serves the verbs with the same answers, remembering
placements, terms and answers per node version so that thousands of nodes cost little while
few change; `tests/extender/test_reference.py` checks that it answers what these functions do.
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.gpu_topology import TopologyStatus
from contract.scheduling_policy import cuda_version_tuple
from extender.placing.filter_outcome import FilterOutcome
from extender.state.pod_requests import PodRequest
from extender.state.snapshot import ClusterSnapshot, TrackedNode
from topology.node_choice import NodeChoice, ranked_choice
from topology.placement import place
from topology.scheduling import Misfit, MisfitReason, Outcome, Placement
from topology.scoring import (
    Fragmentation,
    NodeResourcesContext,
    Ranking,
    RawTerms,
    combine,
    default_fragmentation,
    node_terms,
)

NO_TOPOLOGY = Misfit(MisfitReason.NO_TOPOLOGY, resolvable=False)


def driver_misfit(needed: str, status: TopologyStatus) -> Misfit | None:
    """Why the node's driver cannot run a pod that needs CUDA `needed` ("" needs nothing), or None.
    Forward-compatibility packages inside the image are not seen here: the driver decides."""
    wanted = cuda_version_tuple(needed) if needed else None
    if wanted is None:
        return None
    have = cuda_version_tuple(status.cuda_driver_version)
    if have is None:
        return Misfit(MisfitReason.DRIVER_UNKNOWN, False, f"the pod needs CUDA {needed}")
    if have < wanted:
        driver = f"driver {status.driver_version}" if status.driver_version else "the driver"
        return Misfit(
            MisfitReason.DRIVER_TOO_OLD,
            False,
            f"{driver} runs CUDA up to {status.cuda_driver_version}, the pod needs {needed}",
        )
    return None


def node_outcome(snapshot: ClusterSnapshot, name: str, pod: PodRequest) -> Outcome:
    """Where the pod would go on node `name` in this snapshot, or why it cannot."""
    entry = snapshot.node(name)
    if entry is None or entry.state is None or entry.published is None:
        return NO_TOPOLOGY
    return driver_misfit(pod.cuda_version, entry.published.status) or place(
        entry.state, pod.request, pod.policy, snapshot.workload
    )


def resources_context(entry: TrackedNode, pod: PodRequest, snapshot: ClusterSnapshot) -> NodeResourcesContext:
    """The node's free CPU and memory before and after the pod, and the learned workload
    (CPU and memory unconstrained where the Node does not say its allocatable)."""
    free = entry.free_compute
    allocatable = entry.facts.allocatable if entry.facts is not None else None
    if free is None or allocatable is None:
        return NodeResourcesContext(None, None, None, None, snapshot.workload)
    return NodeResourcesContext(
        free.cpu_milli,
        free.memory_mib,
        free.cpu_milli - pod.compute.cpu_milli,
        free.memory_mib - pod.compute.memory_mib,
        snapshot.workload,
        allocatable.cpu_milli,
    )


def scoring_terms(
    snapshot: ClusterSnapshot,
    name: str,
    pod: PodRequest,
    outcome: Outcome,
    fragmentation: Fragmentation,
) -> RawTerms | None:
    """The pod's scoring terms on node `name` given its `outcome` there (None without a placement)."""
    entry = snapshot.node(name)
    if entry is None or entry.state is None or not isinstance(outcome, Placement):
        return None
    return node_terms(
        entry.state,
        outcome,
        pod.request,
        pod.policy,
        fragmentation,
        resources_context(entry, pod, snapshot),
    )


def chosen_reason(node: str) -> str:
    """What a filter answer narrowed to `node` says of every other passing node."""
    return f"linkpack chose node {node} for this pod (its policy decides the node)"


def narrowed(outcome: FilterOutcome, choice: NodeChoice) -> FilterOutcome:
    """`outcome` with only the chosen node passing; the other passing nodes fail naming it."""
    chosen = choice.chosen.node
    others = dict.fromkeys(outcome.passed, chosen_reason(chosen))
    del others[chosen]
    return FilterOutcome(
        (chosen,), {**outcome.failed, **others}, outcome.unresolvable, {}, outcome.misfits, outcome, choice
    )


def filter_nodes(snapshot: ClusterSnapshot, pod: PodRequest, node_names: Sequence[str]) -> FilterOutcome:
    """Which of `node_names` fit the pod, every bucket in name order (the order asked carries no
    meaning); narrowed to the chosen node when the pod's policy decides it."""
    placed: dict[str, Placement] = {}
    misfits: dict[str, Misfit] = {}
    for name in sorted(set(node_names)):
        outcome = node_outcome(snapshot, name, pod)
        if isinstance(outcome, Placement):
            placed[name] = outcome
        else:
            misfits[name] = outcome
    passed = list(placed)
    answer = FilterOutcome(
        tuple(passed),
        {name: m.message for name, m in misfits.items() if m.resolvable},
        {name: m.message for name, m in misfits.items() if not m.resolvable},
        {},
        misfits,
    )
    if not pod.decide_node or len(passed) < 2:
        return answer
    fragmentation = default_fragmentation()
    candidates = [
        terms
        for name in passed
        if (terms := scoring_terms(snapshot, name, pod, placed[name], fragmentation)) is not None
    ]
    choice = ranked_choice(candidates)
    return answer if choice is None else narrowed(answer, choice)


def prioritize_nodes(snapshot: ClusterSnapshot, pod: PodRequest, node_names: Sequence[str]) -> Ranking:
    """Scores for the nodes that can take the pod, in the order asked (the others get none)."""
    fragmentation = default_fragmentation()
    terms = [
        scoring_terms(snapshot, name, pod, node_outcome(snapshot, name, pod), fragmentation)
        for name in node_names
    ]
    return combine([t for t in terms if t is not None], pod.policy)
