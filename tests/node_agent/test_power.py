"""Power limits for whole-GPU pods with a power budget: the plan, applying it, and the agent loop."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from contract.allocation import Allocation
from contract.keys import ALLOCATION_ANNOTATION
from node_agent.config import AgentConfig
from node_agent.kube.node_api import PodInfo
from node_agent.loop.agent_loop import Agent
from node_agent.loop.power import PowerLimiter, PowerPlan, PowerTarget, budgets, plan_power_limits
from node_agent.metrics import AgentMetrics
from node_agent.sources.nvml_reader import PowerLimits
from node_agent.sources.nvml_simulated import SimulatedNvml
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.support.machines import catalog_machine, topo_text
from tests.support.pods import pod_info
from topology.scheduling import GpuGrant

NODE = "n1"
A100 = SimulatedNvml(catalog_machine("dgx-a100"), node_name=NODE)  # its GPUs: for UUIDs and the plan's input
GPUS = A100.gpus
AT_DEFAULT = {g.index: PowerLimits(400, 100, 400, 400) for g in GPUS}


def _grant(index: int, watts: int, *, whole: bool = True, uuid: str | None = None) -> GpuGrant:
    gpu_uuid = GPUS[index].uuid if uuid is None else uuid
    if whole:
        return GpuGrant(index, gpu_uuid, whole=True, power_w=watts)
    return GpuGrant(index, gpu_uuid, whole=False, memory_mib=1024, units=10, power_w=watts)


def _pod(
    name: str, *grants: GpuGrant, phase: str = "Running", node: str = NODE, record_node: str = NODE
) -> PodInfo:
    return pod_info(name, node=node, phase=phase, record=Allocation(node=record_node, grants=grants))


# ---------------------------------------------------------------------- the plan


@pytest.mark.timeout(10)
def test_budgets_of_whole_gpu_pods_become_limits():
    """Each GPU granted whole with a budget is set to it; the others stay at their default."""
    plan = plan_power_limits([_pod("train", _grant(0, 300), _grant(1, 300))], NODE, GPUS, AT_DEFAULT)
    assert plan.targets == (
        PowerTarget(0, 300, "budget of ml/train"),
        PowerTarget(1, 300, "budget of ml/train"),
    )
    assert plan.notes == ()


@pytest.mark.timeout(10)
def test_nothing_to_do_when_limits_are_as_wanted():
    """GPUs already at their budget or their default need no call."""
    limits = {**AT_DEFAULT, 0: PowerLimits(300, 100, 400, 400)}
    assert plan_power_limits([_pod("train", _grant(0, 300))], NODE, GPUS, limits) == PowerPlan()


@pytest.mark.timeout(10)
def test_gpus_go_back_to_their_default_when_no_budget_holds_them():
    """A GPU at a budget whose pod finished, left or never had one goes back to NVML's default."""
    limits = {**AT_DEFAULT, 2: PowerLimits(250, 100, 400, 400), 3: PowerLimits(250, 100, 400, 400)}
    finished = _pod("done", _grant(2, 250), phase="Succeeded")
    plan = plan_power_limits([finished], NODE, GPUS, limits)
    assert plan.targets == (PowerTarget(2, 400, "default"), PowerTarget(3, 400, "default"))
    no_default = {3: PowerLimits(250, 100, 400, 0)}
    assert plan_power_limits([], NODE, GPUS, no_default).targets == ()  # no default known: left


@pytest.mark.timeout(10)
def test_only_whole_gpu_budgets_of_pods_bound_here_count():
    """Shares, pods of other nodes, records for other nodes and foreign GPUs set no limit."""
    pods = [
        _pod("share", _grant(0, 150, whole=False)),
        _pod("elsewhere", _grant(1, 150), node="n2"),
        _pod("moved", _grant(2, 150), record_node="n2"),
        _pod("wrong-uuid", _grant(3, 150, uuid="GPU-not-here")),
        _pod("no-budget", _grant(4, 0)),
    ]
    plan = plan_power_limits(pods, NODE, GPUS, AT_DEFAULT)
    assert plan.targets == ()
    assert plan.notes == ("pod ml/wrong-uuid: its power budget names GPU 3 GPU-not-here, not a GPU here",)


@pytest.mark.timeout(10)
def test_budgets_outside_the_range_are_clamped_and_said():
    """A budget below the GPU's minimum or above its maximum is applied at the bound, with a note."""
    plan = plan_power_limits(
        [_pod("low", _grant(0, 50)), _pod("high", _grant(1, 900))], NODE, GPUS, AT_DEFAULT
    )
    assert plan.targets == (PowerTarget(0, 100, "budget of ml/low"),)  # GPU 1 is at 400 W already
    assert (
        len(plan.notes) == 2
        and "the 50 W budget of ml/low is outside the settable 100-400 W" in plan.notes[0]
    )


@pytest.mark.timeout(10)
def test_two_budgets_on_one_gpu_take_the_lower():
    """Two records granting one GPU (never granted by the extender) apply the lower budget."""
    held, notes = budgets([_pod("a", _grant(5, 350)), _pod("b", _grant(5, 200))], NODE, GPUS)
    assert held == {5: (200, "ml/b")} and "the lower one is applied" in notes[0]


@pytest.mark.timeout(10)
def test_unknown_limits_and_bad_records_are_noted_not_fatal():
    """A GPU whose limits NVML will not tell is left; an unreadable record is noted and skipped."""
    limits = {i: p for i, p in AT_DEFAULT.items() if i != 6}
    broken = dataclasses.replace(
        _pod("broken", _grant(7, 300)), annotations=MappingProxyType({ALLOCATION_ANNOTATION: "{"})
    )
    plan = plan_power_limits([_pod("train", _grant(6, 300)), broken], NODE, GPUS, limits)
    assert plan.targets == ()
    assert any("cannot be read" in n for n in plan.notes)
    assert any("GPU 6: NVML does not tell its power limits" in n for n in plan.notes)


# ---------------------------------------------------------------------- applying


@pytest.mark.timeout(10)
def test_the_limiter_sets_limits_and_survives_refusals(caplog):
    """Targets are set through the reader; a refusal is reported once and the others still go on."""
    sim = SimulatedNvml(catalog_machine("dgx-a100"), node_name=NODE)
    limiter = PowerLimiter(sim)
    outcome = limiter.apply(PowerPlan((PowerTarget(0, 300, "budget"), PowerTarget(1, 999, "budget"))))
    assert [t.index for t in outcome.applied] == [0] and sim.power_limits(0).limit_w == 300
    assert outcome.failed[0][0].index == 1 and "outside 100-400 W" in outcome.failed[0][1]
    sim.power_settable = False
    for _ in range(3):
        limiter.apply(PowerPlan((PowerTarget(2, 200, "budget"),), ("a note",)))
    refusals = [r for r in caplog.records if "cannot set GPU 2" in r.getMessage()]
    assert len(refusals) == 1 and sum(r.getMessage() == "a note" for r in caplog.records) == 1


# ---------------------------------------------------------------------- the agent


def _agent(tmp_path, **overrides):
    config = AgentConfig(node_name=NODE, proc_root=tmp_path, watchdog=False, **overrides)
    sim = SimulatedNvml(catalog_machine("dgx-a100"), node_name=NODE)
    cluster, clock = FakeNodeApi(NODE), FakeClock()
    text = topo_text("dgx-a100")
    return Agent(config, sim, cluster, AgentMetrics(), lambda: text, clock), sim, cluster, clock


@pytest.mark.timeout(30)
def test_the_agent_holds_budgets_while_the_pod_runs_and_restores_after(tmp_path):
    """With --set-power-limits the pod's GPUs run at its budget, and at their default once it finished."""
    agent, sim, cluster, clock = _agent(tmp_path, set_power_limits=True)
    assert agent.topology.gpus[0].uuid == GPUS[0].uuid  # the same simulated node as the records
    train = _pod("train", _grant(2, 275), _grant(3, 275))
    cluster.pods = [train]
    agent.poll()
    assert sim.power_limit_calls == [(2, 275), (3, 275)]
    power = {p["index"]: p for p in cluster.status["gpuPower"]}
    assert power[2] == {"index": 2, "limitW": 275, "minW": 100, "maxW": 400} and power[0]["limitW"] == 400
    clock.advance(1)
    agent.poll()
    assert sim.power_limit_calls == [(2, 275), (3, 275)]  # held: no more calls
    cluster.pods = [dataclasses.replace(train, phase="Succeeded")]
    clock.advance(1)
    agent.poll()
    assert sim.power_limit_calls[2:] == [(2, 400), (3, 400)]
    assert {p["limitW"] for p in cluster.status["gpuPower"]} == {400}


@pytest.mark.timeout(30)
def test_without_the_flag_budgets_are_published_but_not_applied(tmp_path):
    """By default the agent publishes each GPU's limits and sets none."""
    agent, sim, cluster, _ = _agent(tmp_path)
    cluster.pods = [_pod("train", _grant(0, 250))]
    agent.poll()
    assert sim.power_limit_calls == [] and agent.power_limiter is None
    assert [p["limitW"] for p in cluster.status["gpuPower"]] == [400] * 8
    assert cluster.published is not None and cluster.published.gpu_power[0].max_w == 400


@pytest.mark.timeout(30)
def test_an_unreadable_pod_list_changes_no_limit(tmp_path):
    """When the pods cannot be listed, limits stay as they are (no restore on an API hiccup)."""
    agent, sim, cluster, clock = _agent(tmp_path, set_power_limits=True)
    cluster.pods = [_pod("train", _grant(0, 250))]
    agent.poll()
    assert sim.power_limit_calls == [(0, 250)]
    cluster.pods = []
    real = cluster.list_node_pods

    def failing(node: str) -> tuple[PodInfo, ...]:
        cluster.fail_next = True
        return real(node)

    cluster.list_node_pods = failing  # type: ignore[method-assign]
    clock.advance(1)
    agent.poll()
    assert sim.power_limit_calls == [(0, 250)]
