"""Publishing the node's GpuTopology record: spec on change, status on change or heartbeat.

`plan_publish` decides (pure); `Publisher` carries the plan out through `ClusterApi` and
remembers what the API server holds. Rules:
- the spec (topology codec dict) is written only when its content hash differs from the
  last one written (or found on the record at start-up, so restarts do not rewrite it);
- the status is written when GPU health changed (promptly, on the next tick), when the spec
  was just written, or when `heartbeat_interval_s` passed since the last status write;
- a failed write changes nothing remembered, so the next tick tries again.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node_agent.health import GpuHealth
from node_agent.kube import ClusterApi, KubeError, rfc3339
from topology.codec import content_hash, encode_topology
from topology.model import NodeTopology


@dataclass(frozen=True)
class Published:
    """What the API server holds, as far as this agent knows."""

    spec_hash: str = ""
    status_body: Mapping[str, Any] | None = None  # status without the heartbeat
    status_at: float | None = None


@dataclass(frozen=True, slots=True)
class PublishPlan:
    write_spec: bool
    write_status: bool
    why: str


def plan_publish(
    published: Published,
    spec_hash: str,
    status_body: Mapping[str, Any],
    now: float,
    heartbeat_interval_s: float,
) -> PublishPlan:
    if spec_hash != published.spec_hash:
        why = "new record" if not published.spec_hash else "topology changed"
        return PublishPlan(True, True, why)
    if published.status_body is None or published.status_at is None:
        return PublishPlan(False, True, "first status")
    if dict(status_body) != dict(published.status_body):
        return PublishPlan(False, True, "health changed")
    if now - published.status_at >= heartbeat_interval_s:
        return PublishPlan(False, True, "heartbeat")
    return PublishPlan(False, False, "up to date")


def health_entries(health: Sequence[GpuHealth]) -> list[dict[str, Any]]:
    return [
        {
            "index": h.index,
            "uuid": h.uuid,
            "healthy": h.healthy,
            "reason": h.reason,
            "since": rfc3339(dt.datetime.fromtimestamp(h.since, dt.UTC)),
            "severity": h.severity.value if h.severity is not None else "",
            "cordoned": h.cordoned,
        }
        for h in health
    ]


def status_body(health: Sequence[GpuHealth], agent_version: str) -> dict[str, Any]:
    """The status without its heartbeat (what "changed" is judged on)."""
    return {"gpuHealth": health_entries(health), "agentVersion": agent_version}


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    plan: PublishPlan
    wrote_spec: bool = False
    wrote_status: bool = False
    error: str = ""


class Publisher:
    def __init__(
        self,
        api: ClusterApi,
        node: str,
        agent_version: str,
        heartbeat_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._node = node
        self._version = agent_version
        self._interval = heartbeat_interval_s
        self._clock = clock
        self.published = Published()

    def load_existing(self) -> str:
        """Learn the hash of an existing record so an unchanged spec is not rewritten. '' if none."""
        try:
            record = self._api.get_topology(self._node)
        except KubeError:
            return ""
        if record is not None:
            self.published = Published(spec_hash=record.content_hash)
            return record.content_hash
        return ""

    def publish(self, topology: NodeTopology, health: Sequence[GpuHealth]) -> PublishOutcome:
        now = self._clock()
        spec_hash = content_hash(topology)
        body = status_body(health, self._version)
        plan = plan_publish(self.published, spec_hash, body, now, self._interval)
        wrote_spec = False
        try:
            if plan.write_spec:
                self._api.put_topology_spec(self._node, encode_topology(topology), spec_hash)
                wrote_spec = True
                self.published = Published(spec_hash=spec_hash)
            if plan.write_status:
                status = {**body, "heartbeat": rfc3339(dt.datetime.fromtimestamp(now, dt.UTC))}
                self._api.patch_topology_status(self._node, status)
                self.published = Published(spec_hash, body, now)
        except KubeError as exc:
            return PublishOutcome(plan, wrote_spec, False, str(exc))
        return PublishOutcome(plan, wrote_spec, plan.write_status)
