"""Checking our guesses against the kubelet's own account (pod-resources API). Pure.

Allocate does not say which pod it serves, so a handout may have gone to another pod than
the record's owner (two pods asking for the same amount, admitted in another order than they
were bound). The kubelet's pod-resources List says which container holds which device IDs;
matched against the IDs of each handout it shows who really got what:

- a handout found in its record owner's container is confirmed;
- found in another pod P: P got the record of Q. When P's own record has the same shape, the
  two records are swapped (each pod's record now says what it got; the one not yet handed out
  goes to the other pod, whose Allocate is still to come) and both are rewritten in the API.
  Otherwise P is made the holder of Q's GPUs (capacity stays safe) and the case is reported;
- kubelet assignments of our resources with no handout (an agent restart lost them) adopt the
  matching slot of the pod's record, so its GPUs count as taken again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from contract.allocation import Allocation, Consumption
from contract.pods import PodRef
from node_agent.deviceplugin.records import PodRecord, Slot
from node_agent.deviceplugin.request_matching import (
    Handout,
    HandoutState,
    RecordClaim,
    consumption_of,
    device_order,
    ids_agree,
    reassign_claim,
)


@dataclass(frozen=True, slots=True)
class KubeletAssignment:
    """One container's devices of one resource, as the kubelet's pod-resources List reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Rewrite:
    """A record to write back: replace generation `replaces` of the pod's record with `allocation`."""

    pod: PodRef
    replaces: int
    allocation: Allocation
    consumption: Consumption | None


@dataclass(frozen=True)
class Reconciliation:
    state: HandoutState
    rewrites: tuple[Rewrite, ...] = ()
    overrides: tuple[tuple[str, Allocation], ...] = ()  # pod uid -> record now in force
    confirmed: int = 0
    swapped: tuple[tuple[PodRef, PodRef], ...] = ()
    unresolved: tuple[str, ...] = ()  # what could not be put right, for the log
    adopted: int = 0


def reconcile(
    state: HandoutState, records: Sequence[PodRecord], kubelet: Sequence[KubeletAssignment], now: float
) -> Reconciliation:
    by_name = {(r.ref.namespace, r.ref.name): r for r in records}
    by_uid = {r.ref.uid: r for r in records}
    holders: dict[tuple[str, tuple[str, ...]], set[tuple[str, str, str]]] = {}
    for a in kubelet:
        ids = tuple(sorted(a.device_ids, key=device_order))
        holders.setdefault((a.resource, ids), set()).add((a.namespace, a.pod, a.container))

    confirmed = 0
    stolen: dict[tuple[str, int], PodRecord] = {}  # record (owner uid, generation) -> pod that has it
    unresolved: list[str] = []
    for h in state.handouts:
        found = holders.get((h.slot.resource, h.kubelet_ids), set()) if h.kubelet_ids else set()
        pods = {(ns, name) for ns, name, _ in found}
        if not pods:
            continue
        if (h.slot.pod.namespace, h.slot.pod.name) in pods:
            confirmed += 1
            continue
        actual = by_name.get(min(pods)) if len(pods) == 1 else None
        if actual is None:
            unresolved.append(
                f"devices {list(h.kubelet_ids)} of {h.slot.pod}'s record are with {sorted(pods)}"
            )
            continue
        stolen[(h.slot.pod.uid, h.slot.generation)] = actual

    result = Reconciliation(state, confirmed=confirmed)
    done: set[str] = set()
    for (owner_uid, generation), taker in sorted(stolen.items(), key=lambda kv: kv[0]):
        owner = by_uid.get(owner_uid)
        if owner is None or owner.allocation.generation != generation:
            why = f"{taker.ref} has devices of a record that is no longer current; it now holds them"
            result = replace(result, state=reassign_claim(result.state, (owner_uid, generation), taker.ref))
            unresolved.append(why)
            continue
        if owner_uid in done or taker.ref.uid in done:
            continue
        done.update((owner_uid, taker.ref.uid))
        result = _settle(result, owner, taker)
    result = replace(result, unresolved=(*result.unresolved, *unresolved))
    return _adopt_unknown(result, records, kubelet, now)


def _settle(result: Reconciliation, owner: PodRecord, taker: PodRecord) -> Reconciliation:
    """`taker` got (part of) `owner`'s record: swap the two records, or at least move the hold."""
    owner_key = (owner.ref.uid, owner.allocation.generation)
    if taker.shape != owner.shape:
        why = f"{taker.ref} got {owner.ref}'s record but their requests differ; {taker.ref} now holds it"
        state = reassign_claim(result.state, owner_key, taker.ref)
        return replace(result, state=state, unresolved=(*result.unresolved, why))

    generation = max(owner.allocation.generation, taker.allocation.generation) + 1
    # each record moves to the other pod, slot i to slot i, under a new generation
    moves = {
        (owner.ref.uid, owner.allocation.generation): (owner, taker),
        (taker.ref.uid, taker.allocation.generation): (taker, owner),
    }

    def moved(slot: Slot) -> Slot:
        source, target = moves[(slot.pod.uid, slot.generation)]
        twin = target.slots[[s.key for s in source.slots].index(slot.key)]
        return replace(twin, generation=generation, grants=slot.grants)

    handouts = tuple(
        replace(h, slot=moved(h.slot), holder=moves[(h.slot.pod.uid, h.slot.generation)][1].ref)
        if (h.slot.pod.uid, h.slot.generation) in moves
        else h
        for h in result.state.handouts
    )
    holds = tuple(
        replace(h, record=(moves[h.record][1].ref.uid, generation), holder=moves[h.record][1].ref)
        if h.record in moves
        else h
        for h in result.state.claims
    )
    state = HandoutState(handouts, holds)
    rewrites: list[Rewrite] = []
    overrides: list[tuple[str, Allocation]] = []
    for source, target in moves.values():
        allocation = replace(source.allocation, generation=generation, resources=target.allocation.resources)
        consumption = consumption_of(state, (target.ref.uid, generation))
        rewrites.append(
            Rewrite(
                target.ref,
                target.allocation.generation,
                allocation,
                consumption if consumption.containers else None,
            )
        )
        overrides.append((target.ref.uid, allocation))
    return replace(
        result,
        state=state,
        rewrites=(*result.rewrites, *rewrites),
        overrides=(*result.overrides, *overrides),
        swapped=(*result.swapped, (owner.ref, taker.ref)),
    )


def _adopt_unknown(
    result: Reconciliation, records: Sequence[PodRecord], kubelet: Sequence[KubeletAssignment], now: float
) -> Reconciliation:
    state = result.state
    known = {(h.slot.resource, h.kubelet_ids) for h in state.handouts}
    by_name = {(r.ref.namespace, r.ref.name): r for r in records}
    adopted = 0
    for a in kubelet:
        ids = tuple(sorted(a.device_ids, key=device_order))
        record = by_name.get((a.namespace, a.pod))
        if record is None or (a.resource, ids) in known:
            continue
        slot = next(
            (s for s in record.slots if s.container == a.container and s.resource == a.resource), None
        )
        if slot is None or slot.key in state.consumed:
            continue
        key = (record.ref.uid, record.allocation.generation)
        holds = state.claims
        if state.claim_of(key) is None:
            holds = (*holds, RecordClaim(key, record.ref, record.allocation.grants, now))
        state = HandoutState(
            (*state.handouts, Handout(slot, record.ref, ids, now, ids_agree(slot, ids))), holds
        )
        adopted += 1
    return replace(result, state=state, adopted=result.adopted + adopted)
