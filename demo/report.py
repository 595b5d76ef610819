"""The demo's printed report: where each pod went, how well its GPUs are linked, what is left."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from contract.allocation import decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from demo.cluster import DemoNode
from extender.service import ExtenderService
from topology.bandwidth import link_bandwidth
from topology.fragmentation import node_state_fragmentation
from topology.model import LinkKind, NodeTopology
from topology.placement import set_quality


class PodSource(Protocol):
    def pods(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: str
    node: str
    error: str


def _link_word(topology: NodeTopology, gpus: Sequence[int]) -> str:
    """The slowest link of the best ring through a GPU set, e.g. 'NV18 450 GB/s' or 'SYS 9 GB/s'."""
    if len(gpus) < 2:
        return "-"
    bottleneck = set_quality(topology, gpus).bottleneck_gbps
    words = set()
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            link = topology.link(a, b)
            if abs(link_bandwidth(link.kind, link.nvlinks, topology.gpus[a].model) - bottleneck) < 1e-6:
                words.add(f"NV{link.nvlinks}" if link.kind is LinkKind.NV else link.kind.value)
    return f"{'/'.join(sorted(words))} {bottleneck:.0f} GB/s"


def render_report(
    nodes: Sequence[DemoNode],
    service: ExtenderService,
    cluster: PodSource,
    outcomes: Sequence[Outcome],
    elapsed_s: float,
) -> str:
    lines = ["Linkpack demo: embedded cluster", ""]
    lines.append(f"{'node':<14} {'machine':<18} {'GPUs':>4}  model")
    for n in nodes:
        lines.append(f"{n.name:<14} {n.machine:<18} {n.gpus:>4}  {n.model}")
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    lines += ["", f"{'pod':<20} {'node':<14} {'GPUs':<18} {'share':<16} ring bottleneck"]
    for o in outcomes:
        if not o.node:
            continue
        alloc = decode_allocation(pods[o.pod]["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        entry = service.store.snapshot().node(o.node)
        record = entry.published if entry is not None else None
        assert record is not None
        share = "whole"
        if not alloc.grants[0].whole:
            g = alloc.grants[0]
            share = f"{g.units}u {g.memory_mib // 1024}GiB"
        gpus = ",".join(str(i) for i in alloc.gpu_indices)
        lines.append(
            f"{o.pod:<20} {o.node:<14} {gpus:<18} {share:<16} {_link_word(record.topology, alloc.gpu_indices)}"
        )
    pending = [o for o in outcomes if not o.node]
    if pending:
        lines += ["", "Pending pods and why:"]
        lines += [f"  {o.pod}: {o.error}" for o in pending]
    lines += [
        "",
        f"{'node':<14} {'whole':>5} {'shared':>6} {'free':>5}  {'mem used/total GiB':>19}  fragmentation (GPU)",
    ]
    totals = [0, 0, 0]
    snapshot = service.store.snapshot()
    for name in snapshot.node_names():
        state = snapshot.node_state(name)
        if state is None:
            continue
        whole = sum(1 for u in state.usage if u.whole)
        shared = sum(1 for u in state.usage if not u.whole and not u.idle)
        free = len(state.usage) - whole - shared
        used = sum(
            g.memory_mib if u.whole else u.memory_used_mib
            for g, u in zip(state.topology.gpus, state.usage, strict=True)
        )
        total = sum(g.memory_mib for g in state.topology.gpus)
        frag = node_state_fragmentation(state) / 1000
        totals = [totals[0] + whole, totals[1] + shared, totals[2] + free]
        lines.append(
            f"{name:<14} {whole:>5} {shared:>6} {free:>5}  {used / 1024:>8.0f}/{total / 1024:<8.0f}   {frag:.2f}"
        )
    placed = sum(1 for o in outcomes if o.node)
    lines += [
        "",
        f"Scheduled {placed}/{len(outcomes)} pods in {elapsed_s:.2f}s through HTTP filter/prioritize/bind; "
        f"GPUs whole={totals[0]} shared={totals[1]} free={totals[2]}.",
    ]
    return "\n".join(lines)
