"""Text building blocks shared by the views: kubectl-style columns, ages, sizes. Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from contract.resources import ResourceKind, ResourceNames
from topology.scheduling import GpuGrant


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns aligned like kubectl's: left-aligned, three spaces apart, no trailing blanks."""
    body = [list(headers), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in body) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body)


def age(then: dt.datetime | None, now: dt.datetime) -> str:
    """How long ago, as kubectl prints ages (`40s`, `5m`, `3h`, `2d`); "-" when unknown."""
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def gib(mib: int) -> str:
    """MiB as GiB with one decimal (`30.0Gi`)."""
    return f"{mib / 1024:.1f}Gi"


def share_text(grants: Sequence[GpuGrant], resources: Iterable[str], names: ResourceNames) -> str:
    """What a pod holds, in one cell: `whole`, `MIG <profile>` or `<MiB>Mi/<units>u` per GPU."""
    if not grants:
        return "-"
    if all(g.whole for g in grants):
        return "whole"
    if all(g.mig_uuid for g in grants):
        profiles = sorted({names.mig_profile(r) for r in resources if names.kind(r) is ResourceKind.MIG})
        return "MIG " + ",".join(profiles or [g.mig_uuid for g in grants])
    return ",".join(f"{g.memory_mib}Mi/{g.units}u" for g in grants)
