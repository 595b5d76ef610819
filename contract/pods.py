"""Who a pod is, as every program names it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod's identity: its name and the uid of this incarnation."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return self.key


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    """The identity of a pod given as JSON (namespace "default" when unset)."""
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        meta = {}
    return PodRef(
        str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or "")
    )


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """A pod that Succeeded or Failed holds no devices any more."""
    status = pod.get("status") or {}
    return isinstance(status, Mapping) and str(status.get("phase") or "") in FINISHED_PHASES
