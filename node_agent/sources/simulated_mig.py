"""MIG instances on simulated GPUs: the real profiles of each MIG-capable model and how they fit.

A GPU in MIG mode is cut into 7 compute slices and 8 memory slices. A GPU-instance profile
(`nvidia-smi mig -lgip`) takes some compute slices and a run of memory slices starting at one of
its placements (`nvidia-smi mig -lgipp`): 1-slice profiles start at 0-6, 2-slice ones at 0, 2, 4
(and 6 for 1g.20gb), 3g and 4g profiles at 0 or 4 (4g only 0), 7g at 0. A layout fits when every
instance finds a free placement and the compute slices add up to at most 7; the counts this
allows are the profiles' instance counts (A100-40GB: 1g.5gb x7, 2g.10gb x3, 3g.20gb x2, 4g.20gb
x1, 7g.40gb x1; A100-80GB and H100-80GB: 1g.10gb x7, 1g.20gb x4, 2g.20gb x3, 3g.40gb x2, 4g.40gb
x1, 7g.80gb x1). Instance memory is what `-lgip` lists for the profile (e.g. 9.50 GiB = 9728 MiB
for an A100-80GB 1g.10gb).

Each instance gets the default compute instance (ID 0) and a GPU-instance ID derived from its
placement (7-13 for the 1-slice starts 0-6, as the drivers number them); its UUID is `MIG-<uuid>`
derived from the parent GPU's UUID and that ID, so it is stable per node and GPU. Pure.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topology.model import Gpu, MigDevice

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
_MIG_UUID_NAMESPACE = uuidlib.UUID("2f7d9c1e-8a43-4b6e-b5d0-7c3e1a9f4b28")
#: first GPU-instance ID of each placement size (memory slices): 8 -> 0, 4 -> 1-2, 2 -> 3-6, 1 -> 7-13
_FIRST_GI_ID = {8: 0, 4: 1, 2: 3, 1: 7}


class MigLayoutError(ValueError):
    """A MIG layout the simulated GPU cannot host; the message says what and why."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of a GPU model."""

    name: str  # "1g.10gb"
    compute_slices: int
    memory_slices: int  # also the size of each placement
    memory_mib: int
    starts: tuple[int, ...]  # the memory slice each placement starts at

    @property
    def max_count(self) -> int:
        return len(self.starts)


def _table(*rows: tuple[str, int, int, int, tuple[int, ...]]) -> Mapping[str, MigProfile]:
    return {row[0]: MigProfile(*row) for row in rows}


_ONE, _TWO, _HALF = (0, 1, 2, 3, 4, 5, 6), (0, 2, 4), (0, 4)

A100_40GB = _table(
    ("1g.5gb", 1, 1, 4864, _ONE),
    ("2g.10gb", 2, 2, 9984, _TWO),
    ("3g.20gb", 3, 4, 20096, _HALF),
    ("4g.20gb", 4, 4, 20096, (0,)),
    ("7g.40gb", 7, 8, 40448, (0,)),
)
A100_80GB = _table(
    ("1g.10gb", 1, 1, 9728, _ONE),
    ("1g.20gb", 1, 2, 19968, (0, 2, 4, 6)),
    ("2g.20gb", 2, 2, 19968, _TWO),
    ("3g.40gb", 3, 4, 40192, _HALF),
    ("4g.40gb", 4, 4, 40192, (0,)),
    ("7g.80gb", 7, 8, 80896, (0,)),
)
H100_80GB = _table(
    ("1g.10gb", 1, 1, 9984, _ONE),
    ("1g.20gb", 1, 2, 20096, (0, 2, 4, 6)),
    ("2g.20gb", 2, 2, 20096, _TWO),
    ("3g.40gb", 3, 4, 40448, _HALF),
    ("4g.40gb", 4, 4, 40448, (0,)),
    ("7g.80gb", 7, 8, 81152, (0,)),
)


def mig_profiles(model: str, memory_mib: int) -> Mapping[str, MigProfile]:
    """The MIG profiles a GPU of that model and memory offers; empty when it has no MIG here."""
    upper = model.upper()
    if "A100" in upper:
        return A100_80GB if "80GB" in upper or memory_mib > 61440 else A100_40GB
    if "H100" in upper and "NVL" not in upper and memory_mib <= 86016:
        return H100_80GB
    return {}


def mig_uuid(gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int = 0) -> str:
    """A MIG device UUID in the driver's `MIG-<uuid>` form, derived from its GPU and instance."""
    key = f"{gpu_uuid}/{gpu_instance_id}/{compute_instance_id}"
    return f"MIG-{uuidlib.uuid5(_MIG_UUID_NAMESPACE, key)}"


def carve(gpu: Gpu, profiles: Sequence[str]) -> tuple[MigDevice, ...]:
    """The MIG instances of `profiles` on `gpu`, ordered by placement; MigLayoutError when the
    model has no such profile or they do not fit together."""
    table = mig_profiles(gpu.model, gpu.memory_mib)
    where = f"GPU {gpu.index} ({gpu.model or 'unknown model'}, {gpu.memory_mib} MiB)"
    if not table:
        raise MigLayoutError(f"{where} has no MIG profiles (simulated: A100 40/80GB, H100 80GB)")
    if not profiles:
        raise MigLayoutError(f"{where}: no MIG instances given")
    unknown = sorted({p for p in profiles if p not in table})
    if unknown:
        raise MigLayoutError(f"{where} cannot host {', '.join(unknown)}; its profiles are {', '.join(table)}")
    wanted = [table[p] for p in profiles]
    for profile in table.values():
        count = sum(1 for w in wanted if w is profile)
        if count > profile.max_count:
            raise MigLayoutError(f"{where} holds at most {profile.max_count} x {profile.name}, not {count}")
    compute = sum(w.compute_slices for w in wanted)
    if compute > COMPUTE_SLICES:
        raise MigLayoutError(f"{where}: {' + '.join(profiles)} need {compute} compute slices of 7")
    memory = sum(w.memory_slices for w in wanted)
    if memory > MEMORY_SLICES:
        raise MigLayoutError(f"{where}: {' + '.join(profiles)} need {memory} memory slices of 8")
    placed = _place(sorted(wanted, key=lambda w: -w.memory_slices), frozenset())
    if placed is None:
        raise MigLayoutError(f"{where}: {' + '.join(profiles)} have no free placement together")
    devices = []
    for start, profile in sorted(placed, key=lambda p: p[0]):
        gi = _FIRST_GI_ID[profile.memory_slices] + start // profile.memory_slices
        devices.append(MigDevice(mig_uuid(gpu.uuid, gi), profile.name, gi, 0, profile.memory_mib))
    return tuple(devices)


def carve_layout(
    gpus: Sequence[Gpu], layout: Mapping[int, Sequence[str]]
) -> dict[int, tuple[MigDevice, ...]]:
    """`carve` for each GPU index of `layout`; MigLayoutError also for an index with no GPU."""
    by_index = {g.index: g for g in gpus}
    out: dict[int, tuple[MigDevice, ...]] = {}
    for index, profiles in sorted(layout.items()):
        gpu = by_index.get(index)
        if gpu is None:
            raise MigLayoutError(f"no GPU {index}: the machine has GPUs 0-{len(gpus) - 1}")
        out[index] = carve(gpu, profiles)
    return out


def _place(todo: list[MigProfile], used: frozenset[int]) -> list[tuple[int, MigProfile]] | None:
    """A free placement for each profile (largest first), or None; a small exhaustive search."""
    if not todo:
        return []
    profile, rest = todo[0], todo[1:]
    for start in profile.starts:
        slices = frozenset(range(start, start + profile.memory_slices))
        if slices & used:
            continue
        placed = _place(rest, used | slices)
        if placed is not None:
            return [(start, profile), *placed]
    return None


__all__ = [
    "A100_40GB",
    "A100_80GB",
    "H100_80GB",
    "MigLayoutError",
    "MigProfile",
    "carve",
    "carve_layout",
    "mig_profiles",
    "mig_uuid",
]
