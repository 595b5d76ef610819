"""Publishing the node's GpuTopology: spec on change, status on change or heartbeat.

The object and its status are `contract.gpu_topology`'s; `node_status` builds the status from
the agent's view, `plan_publish` decides (pure) and `Publisher` carries the plan out through
`NodeApi`, remembering what the API server holds. Rules:
- the spec (topology codec) is written only when its content hash differs from the last one
  written (or found on the object at start-up, so restarts do not rewrite it);
- the status is written when it changed (GPU health, cordon problems, MPS, power limits,
  label conflicts: promptly, on the next tick), when the spec was just written, or when `heartbeat_interval_s` passed since the
  last status write;
- a failed write changes nothing remembered, so the next tick tries again.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from contract.gpu_topology import GpuHealthEntry, GpuPower, TopologyStatus
from contract.handoff import NodeHolds
from node_agent.health import GpuHealth
from node_agent.kube.node_api import KubeError, NodeApi, rfc3339
from node_agent.sources.nvml_reader import PowerLimits
from topology.codec import content_hash
from topology.model import NodeTopology


@dataclass(frozen=True)
class Published:
    """What the API server holds, as far as this agent knows."""

    spec_hash: str = ""
    status: TopologyStatus | None = None  # without its heartbeat
    status_at: float | None = None


@dataclass(frozen=True, slots=True)
class PublishPlan:
    write_spec: bool
    write_status: bool
    why: str


def plan_publish(
    published: Published, spec_hash: str, status: TopologyStatus, now: float, heartbeat_interval_s: float
) -> PublishPlan:
    """What to write; `status` is compared without its heartbeat."""
    if spec_hash != published.spec_hash:
        why = "new record" if not published.spec_hash else "topology changed"
        return PublishPlan(True, True, why)
    if published.status is None or published.status_at is None:
        return PublishPlan(False, True, "first status")
    if replace(status, heartbeat="") != published.status:
        return PublishPlan(False, True, "status changed")
    if now - published.status_at >= heartbeat_interval_s:
        return PublishPlan(False, True, "heartbeat")
    return PublishPlan(False, False, "up to date")


def health_entries(health: Sequence[GpuHealth]) -> tuple[GpuHealthEntry, ...]:
    return tuple(
        GpuHealthEntry(
            index=h.index,
            uuid=h.uuid,
            healthy=h.healthy,
            reason=h.reason,
            since=rfc3339(dt.datetime.fromtimestamp(h.since, dt.UTC)),
            severity=h.severity.value if h.severity is not None else "",
            cordoned=h.cordoned,
        )
        for h in health
    )


def node_status(
    topology: NodeTopology,
    health: Sequence[GpuHealth],
    agent_version: str,
    *,
    mps_active: bool = False,
    interposer_available: bool = False,
    cordon_problems: Sequence[str] = (),
    driver_version: str = "",
    cuda_driver_version: str = "",
    power: Sequence[tuple[int, PowerLimits]] = (),
    label_conflicts: Sequence[str] = (),
    holds: NodeHolds | None = None,
) -> TopologyStatus:
    """The status this node publishes (without its heartbeat). `power`: each GPU's limits by
    index, for the GPUs whose limits are known."""
    return TopologyStatus(
        gpu_health=health_entries(health),
        gpu_count=topology.gpu_count,
        agent_version=agent_version,
        mps_active=mps_active,
        interposer_available=interposer_available,
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        gpu_power=tuple(GpuPower(i, p.limit_w, p.min_w, p.max_w) for i, p in power),
        cordon_problems=tuple(cordon_problems),
        label_conflicts=tuple(label_conflicts),
        holds=holds,
    )


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    plan: PublishPlan
    wrote_spec: bool = False
    wrote_status: bool = False
    error: str = ""


class Publisher:
    def __init__(
        self,
        api: NodeApi,
        node: str,
        heartbeat_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._node = node
        self._interval = heartbeat_interval_s
        self._clock = clock
        self.published = Published()
        #: what the object said the node held when this agent started (`contract.handoff`)
        self.inherited_holds: NodeHolds | None = None

    def load_existing(self) -> str:
        """Learn the hash of an existing object so an unchanged spec is not rewritten. '' if none
        (or it cannot be read: then the first publish writes the spec)."""
        try:
            found = self._api.get_topology(self._node)
        except KubeError:
            return ""
        if found is not None:
            self.published = Published(spec_hash=found.content_hash)
            self.inherited_holds = found.status.holds
            return found.content_hash
        return ""

    def publish(self, topology: NodeTopology, status: TopologyStatus) -> PublishOutcome:
        now = self._clock()
        spec_hash = content_hash(topology)
        status = replace(status, heartbeat="")
        plan = plan_publish(self.published, spec_hash, status, now, self._interval)
        wrote_spec = False
        try:
            if plan.write_spec:
                self._api.put_topology_spec(self._node, topology)
                wrote_spec = True
                self.published = Published(spec_hash=spec_hash)
            if plan.write_status:
                beat = rfc3339(dt.datetime.fromtimestamp(now, dt.UTC))
                self._api.patch_topology_status(self._node, replace(status, heartbeat=beat))
                self.published = Published(spec_hash, status, now)
        except KubeError as exc:
            return PublishOutcome(plan, wrote_spec, False, str(exc))
        return PublishOutcome(plan, wrote_spec, plan.write_status)
