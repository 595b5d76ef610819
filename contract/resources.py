"""The extended resources pods ask for GPUs with, and the one place their names are read.

The names are configurable per cluster (`LINKPACK_RESOURCE_*`); the extender, the node agent's
device plugin and the kubectl plugin all read them through `ResourceNames.from_env`, and so do
the share units one GPU is divided into (`LINKPACK_UNITS_PER_GPU`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_UNITS_PER_GPU = 100

ENV_WHOLE = "LINKPACK_RESOURCE_GPU"
ENV_SHARED = "LINKPACK_RESOURCE_SHARED"
ENV_MEMORY = "LINKPACK_RESOURCE_MEMORY"
ENV_MIG_PREFIX = "LINKPACK_RESOURCE_MIG_PREFIX"
ENV_UNITS_PER_GPU = "LINKPACK_UNITS_PER_GPU"


class ResourceKind(StrEnum):
    WHOLE = "whole"  # whole GPUs
    SHARED_UNITS = "shared-units"  # compute share units of one GPU
    MEMORY_MIB = "memory-mib"  # MiB of one GPU's memory, with a share
    MIG = "mig"  # one MIG instance of a profile


class ResourceConfigError(ValueError):
    """A resource setting cannot be used; the message names the variable."""


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """The extended resource names pods use to ask for GPUs."""

    whole: str = "nvidia.com/gpu"
    shared_units: str = "nvidia.com/gpu.shared"
    memory_mib: str = "nvidia.com/gpu.memory"
    mig_prefix: str = "nvidia.com/mig-"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ResourceNames:
        env = os.environ if env is None else env
        defaults = cls()
        names = cls(
            whole=env.get(ENV_WHOLE, defaults.whole).strip(),
            shared_units=env.get(ENV_SHARED, defaults.shared_units).strip(),
            memory_mib=env.get(ENV_MEMORY, defaults.memory_mib).strip(),
            mig_prefix=env.get(ENV_MIG_PREFIX, defaults.mig_prefix).strip(),
        )
        names.check()
        return names

    def check(self) -> None:
        """Raise ResourceConfigError unless every name is a distinct domain-qualified name."""
        fields = {ENV_WHOLE: self.whole, ENV_SHARED: self.shared_units, ENV_MEMORY: self.memory_mib}
        for key, value in [*fields.items(), (ENV_MIG_PREFIX, self.mig_prefix)]:
            if "/" not in value or value.startswith("/") or " " in value:
                raise ResourceConfigError(
                    f"{key}={value!r}: expected a domain-qualified name like nvidia.com/gpu"
                )
        if len(set(fields.values())) != len(fields):
            raise ResourceConfigError(f"resource names must differ: {sorted(fields.values())}")
        if any(v.startswith(self.mig_prefix) for v in fields.values()):
            raise ResourceConfigError(f"{ENV_MIG_PREFIX}={self.mig_prefix!r} overlaps another resource name")

    def kind(self, name: str) -> ResourceKind | None:
        """Which of our resources `name` is; None for any other resource."""
        if name == self.whole:
            return ResourceKind.WHOLE
        if name == self.shared_units:
            return ResourceKind.SHARED_UNITS
        if name == self.memory_mib:
            return ResourceKind.MEMORY_MIB
        if name.startswith(self.mig_prefix) and len(name) > len(self.mig_prefix):
            return ResourceKind.MIG
        return None

    def managed(self, name: str) -> bool:
        return self.kind(name) is not None

    def mig_resource(self, profile: str) -> str:
        return f"{self.mig_prefix}{profile}"

    def mig_profile(self, name: str) -> str:
        """The MIG profile of a MIG resource name ("nvidia.com/mig-1g.10gb" -> "1g.10gb")."""
        if self.kind(name) is not ResourceKind.MIG:
            raise ValueError(f"{name!r} is not a MIG resource (prefix {self.mig_prefix!r})")
        return name[len(self.mig_prefix) :]


def units_per_gpu_from_env(env: Mapping[str, str] | None = None) -> int:
    """Share units one GPU is divided into (`LINKPACK_UNITS_PER_GPU`, default 100)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_UNITS_PER_GPU)
    if raw is None:
        return DEFAULT_UNITS_PER_GPU
    try:
        value = int(raw)
    except ValueError:
        raise ResourceConfigError(f"{ENV_UNITS_PER_GPU}={raw!r}: expected a whole number") from None
    if value < 1:
        raise ResourceConfigError(f"{ENV_UNITS_PER_GPU}={raw!r}: must be positive")
    return value
