"""What this node offers the kubelet: resource names, device IDs and their health.

One device-plugin resource per kind of grant, named by `contract.resources.ResourceNames` (the
same `LINKPACK_RESOURCE_*` settings the extender reads; defaults shown):

- whole GPUs (`nvidia.com/gpu`): one device per GPU, device ID = GPU UUID;
- share units (`nvidia.com/gpu.shared`): `units_per_gpu` devices per GPU, ID `<GPU-uuid>::u<k>`;
- MIG instances (`nvidia.com/mig-<profile>`): one resource per profile present, ID = MIG UUID.

The memory resource (`nvidia.com/gpu.memory`) is accounted by the scheduler only; no device
plugin serves it. GPUs in MIG mode are offered only through their MIG instances. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from contract.resources import DEFAULT_UNITS_PER_GPU, ResourceKind, ResourceNames
from topology.model import MigMode, NodeTopology

SHARE_UNIT_SEPARATOR = "::u"
MAX_DEVICE_ID_LENGTH = 63  # the kubelet's limit on Device.ID

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

#: The kinds of resource a device plugin serves.
SERVED_KINDS = frozenset({ResourceKind.WHOLE, ResourceKind.SHARED_UNITS, ResourceKind.MIG})


def share_unit_id(gpu_uuid: str, unit: int) -> str:
    return f"{gpu_uuid}{SHARE_UNIT_SEPARATOR}{unit}"


def share_unit_gpu(device_id: str) -> str:
    """The GPU UUID a share-unit device ID belongs to ("" when the ID is not a share unit)."""
    gpu, sep, unit = device_id.rpartition(SHARE_UNIT_SEPARATOR)
    return gpu if sep and unit.isdigit() else ""


def share_unit_number(device_id: str) -> int:
    _, sep, unit = device_id.rpartition(SHARE_UNIT_SEPARATOR)
    return int(unit) if sep and unit.isdigit() else -1


@dataclass(frozen=True, slots=True)
class MigInstance:
    uuid: str
    profile: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class NodeGpu:
    """One physical GPU as the device plugin offers it."""

    index: int
    uuid: str
    memory_mib: int
    numa_node: int | None = None
    mig_enabled: bool = False
    mig: tuple[MigInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class AdvertisedDevice:
    """One device in a ListAndWatch answer."""

    id: str
    healthy: bool
    numa_node: int | None


@dataclass(frozen=True)
class Inventory:
    """The GPUs of this node and how many share units each is divided into."""

    gpus: tuple[NodeGpu, ...]
    units_per_gpu: int = DEFAULT_UNITS_PER_GPU
    names: ResourceNames = field(default_factory=ResourceNames)

    def __post_init__(self) -> None:
        if self.units_per_gpu < 1:
            raise ValueError(f"units_per_gpu must be positive, got {self.units_per_gpu}")
        for gpu in self.gpus:
            longest = share_unit_id(gpu.uuid, self.units_per_gpu - 1)
            for device_id in (longest, *(m.uuid for m in gpu.mig)):
                if not device_id or len(device_id) > MAX_DEVICE_ID_LENGTH:
                    raise ValueError(f"device ID {device_id!r} is empty or over {MAX_DEVICE_ID_LENGTH} chars")

    @classmethod
    def from_topology(
        cls,
        topology: NodeTopology,
        units_per_gpu: int = DEFAULT_UNITS_PER_GPU,
        names: ResourceNames | None = None,
    ) -> Inventory:
        """The inventory of a discovered node; GPUs without a UUID cannot be offered and are left out."""
        gpus = tuple(
            NodeGpu(
                index=g.index,
                uuid=g.uuid,
                memory_mib=g.memory_mib,
                numa_node=g.numa_node,
                mig_enabled=g.mig_mode is MigMode.ENABLED,
                mig=tuple(MigInstance(m.uuid, m.profile, m.memory_mib) for m in g.mig_devices),
            )
            for g in topology.gpus
            if g.uuid
        )
        return cls(gpus, units_per_gpu, names or ResourceNames())

    def kind(self, resource: str) -> ResourceKind | None:
        """Which kind of grant a resource hands out; None when no plugin of ours serves it."""
        kind = self.names.kind(resource)
        return kind if kind in SERVED_KINDS else None

    def serves(self, resource: str) -> bool:
        return self.kind(resource) is not None

    @cached_property
    def _gpu_by_uuid(self) -> dict[str, NodeGpu]:
        return {g.uuid: g for g in self.gpus}

    @cached_property
    def _mig_parent(self) -> dict[str, tuple[NodeGpu, MigInstance]]:
        return {m.uuid: (g, m) for g in self.gpus for m in g.mig}

    def gpu(self, uuid: str) -> NodeGpu | None:
        return self._gpu_by_uuid.get(uuid)

    def mig_instance(self, mig_uuid: str) -> tuple[NodeGpu, MigInstance] | None:
        """The MIG instance with that UUID and the GPU it is carved from."""
        return self._mig_parent.get(mig_uuid)

    @property
    def mig_profiles(self) -> tuple[str, ...]:
        return tuple(sorted({m.profile for g in self.gpus if g.mig_enabled for m in g.mig}))

    @property
    def resources(self) -> tuple[str, ...]:
        """The resource names to serve, one plugin each, in a stable order."""
        names: list[str] = []
        if any(not g.mig_enabled for g in self.gpus):
            names += [self.names.whole, self.names.shared_units]
        names += [self.names.mig_resource(p) for p in self.mig_profiles]
        return tuple(names)

    def devices(self, resource: str, unhealthy: frozenset[str] = frozenset()) -> tuple[AdvertisedDevice, ...]:
        """Every device of `resource`. `unhealthy` holds GPU or MIG UUIDs; a sick GPU sickens its parts."""
        kind = self.kind(resource)
        plain = [g for g in self.gpus if not g.mig_enabled]
        if kind is ResourceKind.WHOLE:
            return tuple(AdvertisedDevice(g.uuid, g.uuid not in unhealthy, g.numa_node) for g in plain)
        if kind is ResourceKind.SHARED_UNITS:
            return tuple(
                AdvertisedDevice(share_unit_id(g.uuid, k), g.uuid not in unhealthy, g.numa_node)
                for g in plain
                for k in range(self.units_per_gpu)
            )
        if kind is ResourceKind.MIG:
            profile = self.names.mig_profile(resource)
            return tuple(
                AdvertisedDevice(m.uuid, g.uuid not in unhealthy and m.uuid not in unhealthy, g.numa_node)
                for g in self.gpus
                if g.mig_enabled
                for m in g.mig
                if m.profile == profile
            )
        return ()
