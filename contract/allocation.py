"""The allocation record: what the extender granted a pod, as stored on the pod.

The extender writes it into the pod annotation `linkpack.io/allocation` with the Binding; the
node agent's device plugin reads it to hand each container exactly that, and writes back
`linkpack.io/consumed` once the kubelet asked for it. Both are versioned JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from topology.scheduling import GpuGrant

ALLOCATION_SCHEMA = "linkpack.io/allocation/v1"
CONSUMED_SCHEMA = "linkpack.io/consumed/v1"


class Enforcement(StrEnum):
    """How strictly a container is held to its grant on the node (recorded in the allocation)."""

    NONE = "none"  # whole GPUs: device isolation is all there is to enforce
    COOPERATIVE = "cooperative"  # framework memory caps through the shim; a process may ignore them
    INTERPOSER = "interposer"  # the CUDA driver-API interposer: memory cap and time-slice quota
    HARD_MPS = "hard-mps"  # CUDA MPS: pinned memory limit and active thread percentage per client
    MIG = "mig"  # hardware partition


#: Values written by earlier versions, read as today's level.
_LEGACY_LEVELS = {"mps": Enforcement.HARD_MPS}


class ComputePriority(StrEnum):
    """How a share's kernels yield to other sharers of its GPU."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


_PRIORITY_NAMES = frozenset(p.value for p in ComputePriority)


def enforcement_for(
    grants: Sequence[GpuGrant],
    mps_enabled: bool,
    interposer_available: bool = False,
    interposer_opt_out: bool = False,
) -> Enforcement:
    """How strictly these grants are held on a node, decided once (by the extender, from what the
    node publishes about itself): MIG instances by hardware, whole GPUs need nothing; shares by
    MPS where the node runs an MPS daemon, else by the interposer where the node ships it (unless
    the pod opted out), else only cooperatively."""
    if any(g.mig_uuid for g in grants):
        return Enforcement.MIG
    if all(g.whole for g in grants):
        return Enforcement.NONE
    if mps_enabled:
        return Enforcement.HARD_MPS
    if interposer_available and not interposer_opt_out:
        return Enforcement.INTERPOSER
    return Enforcement.COOPERATIVE


class AllocationError(ValueError):
    """An allocation or consumed record is malformed; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one pod was granted on one node. `generation` increases with every rewrite."""

    node: str
    grants: tuple[GpuGrant, ...]
    generation: int = 1
    enforcement: Enforcement = Enforcement.NONE
    resources: tuple[tuple[str, int], ...] = ()  # extended resources the pod asked for, sorted
    priority: ComputePriority = ComputePriority.NORMAL  # how its kernels yield to other sharers

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.grants)

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.grants)


@dataclass(frozen=True, slots=True)
class Consumption:
    """Which containers of a pod the node agent handed the allocation to (written back)."""

    generation: int
    containers: tuple[str, ...]
    device_ids: tuple[str, ...]


def encode_grant(g: GpuGrant) -> dict[str, Any]:
    """One GPU grant in the `gpus` form of an allocation record (also used by `contract.handoff`)."""
    return {
        "index": g.index,
        "uuid": g.uuid,
        "whole": g.whole,
        "memoryMiB": g.memory_mib,
        "units": g.units,
        "migUuid": g.mig_uuid,
        **({"powerW": g.power_w} if g.power_w else {}),
    }


def encode_allocation(a: Allocation) -> str:
    doc = {
        "schema": ALLOCATION_SCHEMA,
        "node": a.node,
        "generation": a.generation,
        "enforcement": a.enforcement.value,
        "resources": dict(a.resources),
        "gpus": [encode_grant(g) for g in a.grants],
    }
    if a.priority is not ComputePriority.NORMAL:  # absent means normal (as in older records)
        doc["computePriority"] = a.priority.value
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode_allocation(text: str) -> Allocation:
    doc = _load_object(text, "allocation")
    _expect_schema(doc, ALLOCATION_SCHEMA)
    gpus = _field(doc, "gpus", list)
    grants = tuple(_decode_grant(g, i) for i, g in enumerate(gpus))
    if not grants:
        raise AllocationError("allocation: 'gpus' is empty")
    resources = _field(doc, "resources", dict)
    named = _field(doc, "enforcement", str)
    try:
        enforcement = _LEGACY_LEVELS.get(named) or Enforcement(named)
    except ValueError as exc:
        raise AllocationError(f"allocation: field 'enforcement': unknown level {named[:40]!r}") from exc
    priority_name = doc.get("computePriority", ComputePriority.NORMAL.value)  # absent in older records
    if not isinstance(priority_name, str) or priority_name not in _PRIORITY_NAMES:
        raise AllocationError(
            f"allocation: field 'computePriority': expected high, normal or low, got {str(priority_name)[:40]!r}"
        )
    return Allocation(
        node=_field(doc, "node", str),
        grants=grants,
        generation=_field(doc, "generation", int),
        enforcement=enforcement,
        priority=ComputePriority(priority_name),
        resources=tuple(sorted((str(k), _as_int(v, f"resources.{k}")) for k, v in resources.items())),
    )


def encode_consumption(c: Consumption) -> str:
    doc = {
        "schema": CONSUMED_SCHEMA,
        "generation": c.generation,
        "containers": list(c.containers),
        "deviceIds": list(c.device_ids),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode_consumption(text: str) -> Consumption:
    doc = _load_object(text, "consumed")
    _expect_schema(doc, CONSUMED_SCHEMA)
    containers = _field(doc, "containers", list)
    device_ids = _field(doc, "deviceIds", list)
    return Consumption(
        generation=_field(doc, "generation", int),
        containers=tuple(str(c) for c in containers),
        device_ids=tuple(str(d) for d in device_ids),
    )


def decode_grant(raw: object, position: int) -> GpuGrant:
    """One GPU grant in the `gpus` form of an allocation record (also used by `contract.handoff`)."""
    return _decode_grant(raw, position)


def _decode_grant(raw: object, position: int) -> GpuGrant:
    where = f"allocation: gpus[{position}]"
    if not isinstance(raw, dict):
        raise AllocationError(f"{where} is not an object")
    return GpuGrant(
        index=_field(raw, "index", int, where),
        uuid=_field(raw, "uuid", str, where),
        whole=_field(raw, "whole", bool, where),
        memory_mib=_field(raw, "memoryMiB", int, where),
        units=_field(raw, "units", int, where),
        mig_uuid=_field(raw, "migUuid", str, where),
        power_w=_non_negative(raw, "powerW", where) if "powerW" in raw else 0,
    )


def _non_negative(raw: dict[str, Any], key: str, where: str) -> int:
    value = int(_field(raw, key, int, where))
    if value < 0:
        raise AllocationError(f"{where}: field {key!r} must not be negative, got {value}")
    return value


def load_json_object(text: object, what: str, error: type[ValueError]) -> dict[str, Any]:
    """A JSON object from text that may be anything: `error` (naming `what`) unless it is one.

    Also refuses what `json.loads` itself chokes on: nesting deeper than the interpreter's
    recursion limit and integers of more than 4300 digits."""
    if not isinstance(text, str):
        raise error(f"{what}: expected JSON text, got {type(text).__name__}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what}: not JSON ({exc.msg} at position {exc.pos})") from exc
    except RecursionError:
        raise error(f"{what}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer too long to convert
        raise error(f"{what}: unreadable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise error(f"{what}: expected a JSON object")
    return doc


def _load_object(text: str, what: str) -> dict[str, Any]:
    return load_json_object(text, what, AllocationError)


def _expect_schema(doc: dict[str, Any], schema: str) -> None:
    found = doc.get("schema")
    if found != schema:
        raise AllocationError(f"unsupported schema {found!r}, expected {schema!r}")


def _field(doc: dict[str, Any], key: str, kind: type, where: str = "allocation") -> Any:
    if key not in doc:
        raise AllocationError(f"{where}: missing field {key!r}")
    value = doc[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise AllocationError(f"{where}: field {key!r} must be an integer, got {value!r}")
    if not isinstance(value, kind):
        raise AllocationError(f"{where}: field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _as_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AllocationError(f"allocation: {where} must be an integer, got {value!r}")
    return value
