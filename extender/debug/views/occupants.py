"""What the debug views show of a node's ledger: who holds which GPU.

The views' input is the extender's own `extender.state.snapshot.TrackedNode` (one node in one cluster
snapshot); the JSON documents, the SVG drawing and the HTML pages are pure functions of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.ledger import Ledger
from topology.scheduling import GpuGrant

NO_TOPOLOGY_MESSAGE = (
    "node has no GPU topology record: no GpuTopology object names it, or the object is malformed "
    "(the extender logs why); pods asking for GPUs will not be placed here"
)


@dataclass(frozen=True, slots=True)
class Occupant:
    """What one pod holds on one GPU (from the node's ledger)."""

    namespace: str
    name: str
    uid: str
    grant: GpuGrant

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def grant_text(self) -> str:
        """The grant in words: "whole GPU", "MIG <uuid>" or "<MiB> MiB, <units> units"."""
        g = self.grant
        if g.whole:
            return "whole GPU"
        if g.mig_uuid:
            return f"MIG {g.mig_uuid}"
        return f"{g.memory_mib} MiB, {g.units} units"


def occupants_by_gpu(ledger: Ledger) -> dict[int, list[Occupant]]:
    """Per GPU index, the pods holding part or all of it, in ledger order."""
    out: dict[int, list[Occupant]] = {}
    for entry in ledger.entries:
        for grant in entry.allocation.grants:
            out.setdefault(grant.index, []).append(
                Occupant(entry.namespace, entry.name, entry.pod_uid, grant)
            )
    return out
