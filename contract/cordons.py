"""The node annotation `linkpack.io/cordoned-gpus`: GPUs an operator keeps out of new placements.

Format: comma-separated GPU UUIDs as `nvidia-smi -L` prints them (`GPU-xxxxxxxx-xxxx-...`), in
any letter case. UUIDs compare case-insensitively everywhere. An entry that is not a GPU UUID
(a MIG UUID, an index, a typo) is not silently dropped: it is reported in `problems`, which the
node agent publishes in its GpuTopology status and the extender shows in its explanations. The
valid entries of a partly wrong annotation are still honoured.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from contract.keys import CORDON_ANNOTATION

_GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Cordons:
    """The cordoned GPU UUIDs (canonical form) and what was wrong with the rest of the entries."""

    uuids: frozenset[str] = frozenset()
    problems: tuple[str, ...] = ()

    def covers(self, uuid: str) -> bool:
        return canonical_gpu_uuid(uuid) in self.uuids

    def indices(self, gpus: Iterable[tuple[int, str]]) -> frozenset[int]:
        """Indices of the (index, uuid) GPUs that are cordoned."""
        if not self.uuids:
            return frozenset()
        return frozenset(index for index, uuid in gpus if self.covers(uuid))

    def unknown(self, known_uuids: Iterable[str]) -> tuple[str, ...]:
        """Cordoned UUIDs that are not among `known_uuids` (typos, or a GPU that was replaced)."""
        known = {canonical_gpu_uuid(u) for u in known_uuids}
        return tuple(sorted(u for u in self.uuids if u not in known))


def canonical_gpu_uuid(uuid: str) -> str:
    """`GPU-` followed by lower-case hex: the one spelling UUIDs are compared in."""
    uuid = uuid.strip()
    if uuid[:4].upper() == "GPU-":
        return "GPU-" + uuid[4:].lower()
    return uuid.lower()


def parse_cordons(value: str | None) -> Cordons:
    """The annotation's value (absent or blank: nothing cordoned). Never raises."""
    if value is None or not value.strip():
        return Cordons()
    uuids: set[str] = set()
    problems: list[str] = []
    for position, raw in enumerate(value.split(","), start=1):
        entry = raw.strip()
        where = f"{CORDON_ANNOTATION}: entry {position}"
        if not entry:
            problems.append(f"{where} is empty (two commas in a row, or a trailing comma?)")
        elif entry[:4].upper() == "MIG-":
            problems.append(f"{where} {entry[:60]!r} is a MIG instance; cordon its parent GPU instead")
        elif not _GPU_UUID.match(entry):
            problems.append(
                f"{where} {entry[:60]!r} is not a GPU UUID; expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx "
                "as printed by `nvidia-smi -L`"
            )
        else:
            uuids.add(canonical_gpu_uuid(entry))
    return Cordons(frozenset(uuids), tuple(problems))


def format_cordons(uuids: Iterable[str]) -> str:
    return ",".join(sorted({canonical_gpu_uuid(u) for u in uuids}))
