"""The extended resource names tests ask for: the contract's defaults (`contract.resources`).

Tests write `GPU`, `SHARED`, `MEMORY` and `mig_resource("1g.10gb")` rather than the names' text,
so the names live in one place. Tests whose point is the text on the wire (golden payloads, the
defaults themselves, messages quoted to users) keep it literal and say so.
"""

from __future__ import annotations

from contract.resources import ResourceNames

NAMES = ResourceNames()
#: whole GPUs
GPU = NAMES.whole
#: compute share units of one GPU
SHARED = NAMES.shared_units
#: MiB of one GPU's memory, asked beside a share
MEMORY = NAMES.memory_mib


def mig_resource(profile: str) -> str:
    """The resource of one MIG instance of `profile` ("1g.10gb")."""
    return NAMES.mig_resource(profile)
