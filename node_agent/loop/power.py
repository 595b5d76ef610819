"""GPU power limits for pods granted a power budget (`--set-power-limits`, off by default).

The extender may grant a whole-GPU pod a power budget per GPU (`power_w` on the allocation's
grants, `contract.allocation`). With `--set-power-limits` (it needs the privilege to change
power limits: root in the agent's container) the agent holds each granted GPU's NVML power
limit at the budget while the pod runs, and puts the GPU's default limit back when no pod with
a budget holds it. The agent then owns the limits of the node's GPUs: a limit set by hand is
reset to the default at the next poll, so leave the option off on nodes where operators set
limits themselves.

`plan_power_limits` decides (pure) from the pods bound to the node with their allocation
records, the node's GPUs and their current limits; `PowerLimiter` applies the plan through the
NVML reader. Rules:
- only whole-GPU grants with `power_w` > 0 of pods bound to this node and not finished count,
  and only for GPUs of this node (index and UUID match);
- a budget outside the GPU's settable range is clamped into it (and said so);
- two budgets on one GPU (which the extender never grants) take the lower;
- a GPU with no budget goes back to its default limit (NVML's), when the default is known;
- a GPU whose limits NVML will not tell is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contract.allocation import AllocationError, decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from node_agent.kube.node_api import PodInfo
from node_agent.sources.nvml_reader import NvmlError, NvmlReader, PowerLimits
from topology.model import Gpu
from topology.scheduling import GpuGrant

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PowerTarget:
    """Set GPU `index`'s power limit to `watts`; `why` names the budget's pod or "default"."""

    index: int
    watts: int
    why: str


@dataclass(frozen=True, slots=True)
class PowerPlan:
    """The limits to change (only those that differ from now) and what is worth telling."""

    targets: tuple[PowerTarget, ...] = ()
    notes: tuple[str, ...] = ()


def grant_power_w(grant: GpuGrant) -> int:
    """A grant's power budget in watts (0: none; records written before budgets have none)."""
    return max(0, grant.power_w)


def budgets(
    pods: Sequence[PodInfo], node: str, gpus: Sequence[Gpu]
) -> tuple[dict[int, tuple[int, str]], list[str]]:
    """The power budget on each GPU of the node, by index: (watts, "namespace/pod"), and notes."""
    by_index = {g.index: g for g in gpus}
    found: dict[int, tuple[int, str]] = {}
    notes: list[str] = []
    for pod in pods:
        raw = pod.annotations.get(ALLOCATION_ANNOTATION)
        if raw is None or pod.finished or pod.node_name != node:
            continue
        name = f"{pod.namespace}/{pod.name}"
        try:
            allocation = decode_allocation(raw)
        except AllocationError as exc:
            notes.append(f"pod {name}: its allocation record cannot be read ({exc}); no power budget applied")
            continue
        if allocation.node != node:
            continue
        for grant in allocation.grants:
            watts = grant_power_w(grant)
            if not grant.whole or not watts:
                continue
            gpu = by_index.get(grant.index)
            if gpu is None or (grant.uuid and gpu.uuid and grant.uuid.lower() != gpu.uuid.lower()):
                notes.append(
                    f"pod {name}: its power budget names GPU {grant.index} {grant.uuid}, not a GPU here"
                )
                continue
            held = found.get(grant.index)
            if held is not None:
                notes.append(
                    f"GPU {grant.index}: budgets of {held[1]} ({held[0]} W) and {name} ({watts} W); "
                    "the lower one is applied"
                )
                if held[0] <= watts:
                    continue
            found[grant.index] = (watts, name)
    return found, notes


def plan_power_limits(
    pods: Sequence[PodInfo], node: str, gpus: Sequence[Gpu], limits: Mapping[int, PowerLimits]
) -> PowerPlan:
    """The power limits to set now, by the rules of the module docstring."""
    held, notes = budgets(pods, node, gpus)
    targets: list[PowerTarget] = []
    for gpu in gpus:
        now = limits.get(gpu.index)
        budget = held.get(gpu.index)
        if now is None or not now.known:
            if budget is not None:
                notes.append(
                    f"GPU {gpu.index}: NVML does not tell its power limits; the {budget[0]} W budget of "
                    f"{budget[1]} is not applied"
                )
            continue
        if budget is None:
            if now.default_w <= 0:
                continue  # no default to go back to: leave it
            wanted, why = now.default_w, "default"
        else:
            wanted, why = _clamped(budget[0], now), f"budget of {budget[1]}"
            if wanted != budget[0]:
                notes.append(
                    f"GPU {gpu.index}: the {budget[0]} W budget of {budget[1]} is outside the settable "
                    f"{now.min_w}-{now.max_w} W; {wanted} W is applied"
                )
        if wanted != now.limit_w:
            targets.append(PowerTarget(gpu.index, wanted, why))
    return PowerPlan(tuple(targets), tuple(notes))


def _clamped(watts: int, limits: PowerLimits) -> int:
    if limits.max_w > 0:
        watts = min(watts, limits.max_w)
    return max(watts, limits.min_w)


@dataclass(frozen=True, slots=True)
class PowerOutcome:
    """The limits that were set and those NVML refused (with its reason)."""

    applied: tuple[PowerTarget, ...] = ()
    failed: tuple[tuple[PowerTarget, str], ...] = ()


class PowerLimiter:
    """Applies power plans through the NVML reader; says each note and refusal once."""

    def __init__(self, reader: NvmlReader) -> None:
        self._reader = reader
        self._told: set[str] = set()

    def apply(self, plan: PowerPlan) -> PowerOutcome:
        for note in plan.notes:
            self._tell(note)
        applied: list[PowerTarget] = []
        failed: list[tuple[PowerTarget, str]] = []
        for target in plan.targets:
            try:
                self._reader.set_power_limit(target.index, target.watts)
            except NvmlError as exc:
                failed.append((target, str(exc)))
                self._tell(
                    f"cannot set GPU {target.index}'s power limit to {target.watts} W ({target.why}): {exc}"
                )
                continue
            log.info("GPU %d power limit set to %d W (%s)", target.index, target.watts, target.why)
            applied.append(target)
        return PowerOutcome(tuple(applied), tuple(failed))

    def _tell(self, message: str) -> None:
        if message not in self._told:
            if len(self._told) > 1000:  # bounded: a message may come again after many others
                self._told.clear()
            self._told.add(message)
            log.warning("%s", message)
