"""The agent loop over a simulated NVML and an in-memory API: health, cordons, watchdog, status."""

from __future__ import annotations

import threading
import time
from types import MappingProxyType

import pytest

from contract.allocation import Allocation, Enforcement, encode_allocation
from contract.keys import ALLOCATION_ANNOTATION, CORDON_ANNOTATION
from node_agent.config import AgentConfig
from node_agent.kube.node_api import PodInfo
from node_agent.loop.agent_loop import Agent
from node_agent.metrics import AgentMetrics
from node_agent.sources.nvml_reader import XidEvent
from node_agent.sources.nvml_simulated import SimulatedNvml
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.support.machines import catalog_machine, topo_text
from topology.scheduling import GpuGrant

MIB = 1024 * 1024


def _agent(tmp_path, name="hgx-h100", **overrides):
    config = AgentConfig(node_name="n1", recheck_after_s=60, proc_root=tmp_path, **overrides)
    sim = SimulatedNvml(catalog_machine(name), node_name="n1")
    cluster, clock = FakeNodeApi(), FakeClock()
    text = topo_text(name)
    agent = Agent(config, sim, cluster, AgentMetrics(), lambda: text, clock)
    return agent, sim, cluster, clock


def _next_event(sim: SimulatedNvml) -> XidEvent:
    event = sim.wait_event(0)
    assert event is not None
    return event


def _healthy(cluster):
    return [g["healthy"] for g in cluster.status["gpuHealth"]]


def _cordoned(cluster):
    return [g["cordoned"] for g in cluster.status["gpuHealth"]]


def test_first_poll_publishes_the_spec_and_a_healthy_status(tmp_path):
    """The first poll writes the spec and a status with every GPU healthy, and the metrics show them."""
    agent, _, cluster, _ = _agent(tmp_path)
    agent.poll()
    assert cluster.spec is not None and cluster.spec["contentHash"] == cluster.spec_hash
    assert len(cluster.spec["gpus"]) == 8 and cluster.spec["nvswitch"] is True
    assert _healthy(cluster) == [True] * 8
    body, _ = agent.metrics.render()
    assert b'linkpack_gpu_healthy{gpu="0"' in body and b"linkpack_gpu_memory_total_bytes" in body


def test_the_status_carries_the_gpu_count(tmp_path):
    """The status says how many GPUs the node has, which the CRD's printer column shows."""
    agent, _, cluster, _ = _agent(tmp_path, name="dgx1-v100")
    agent.poll()
    assert cluster.status["gpuCount"] == 8 == agent.topology.gpu_count
    assert cluster.published is not None and cluster.published.gpu_count == 8
    assert cluster.status["interposer"] == {"available": False}  # until the device plugins deliver it


def test_mps_is_active_while_the_configured_pipe_directory_exists(tmp_path):
    """The node says MPS is active only when its configured pipe directory exists."""
    pipe = tmp_path / "mps"
    agent, _, cluster, clock = _agent(tmp_path, mps_pipe_dir=str(pipe))
    agent.poll()
    assert cluster.status["mps"] == {"active": False}
    pipe.mkdir()
    clock.advance(1)
    agent.poll()
    assert cluster.status["mps"] == {"active": True}
    unconfigured, _, other, _ = _agent(tmp_path)
    unconfigured.poll()
    assert other.status["mps"] == {"active": False}


def test_xid_marks_unhealthy_promptly_and_recovers_after_recheck(tmp_path):
    """A reset-class XID is published at once and cleared by the re-check after the wait."""
    agent, sim, cluster, clock = _agent(tmp_path)
    agent.poll()
    sim.inject_xid(3, 48)
    agent.handle_event(_next_event(sim))
    assert _healthy(cluster)[3] is False  # written at once, not at the next heartbeat
    assert cluster.status["gpuHealth"][3]["reason"].startswith("XID 48")
    assert [e.reason for e in cluster.events] == ["GpuUnhealthy"]
    body, _ = agent.metrics.render()
    assert b'xid="48"' in body
    clock.advance(59)
    agent.poll()
    assert _healthy(cluster)[3] is False
    clock.advance(1)
    agent.poll()
    assert _healthy(cluster)[3] is True
    assert [e.reason for e in cluster.events] == ["GpuUnhealthy", "GpuRecovered"]


def test_application_xid_counts_but_keeps_the_gpu(tmp_path):
    """An application XID is counted but neither marks the GPU nor writes the status."""
    agent, sim, cluster, _ = _agent(tmp_path)
    agent.poll()
    writes = cluster.status_writes
    sim.inject_xid(1, 13)
    agent.handle_event(_next_event(sim))
    assert _healthy(cluster)[1] is True and cluster.status_writes == writes and cluster.events == []


def test_ecc_fault_holds_until_cleared_then_recovers(tmp_path):
    """An ECC fault keeps the GPU out until the counters are clean at a re-check."""
    agent, sim, cluster, clock = _agent(tmp_path)
    sim.set_ecc(5, volatile_uncorrected=1)
    agent.poll()
    assert _healthy(cluster)[5] is False
    clock.advance(60)
    agent.poll()
    assert _healthy(cluster)[5] is False  # re-check still sees the error
    sim.clear_faults(5)
    clock.advance(60)
    agent.poll()
    assert _healthy(cluster)[5] is True


def test_lost_gpu_is_fatal_and_keeps_the_xid_as_its_reason(tmp_path):
    """After XID 79 the GPU stops answering, and later polls keep the XID as the published reason."""
    agent, sim, cluster, clock = _agent(tmp_path)
    agent.poll()
    sim.inject_xid(2, 79)
    agent.handle_event(_next_event(sim))
    for _ in range(3):
        clock.advance(10_000)
        agent.poll()
    entry = cluster.status["gpuHealth"][2]
    assert entry["healthy"] is False and entry["severity"] == "fatal"
    assert entry["reason"].startswith("XID 79")
    assert [e.reason for e in cluster.events] == ["GpuUnhealthy"]


def test_the_xid_wins_when_a_poll_sees_the_lost_gpu_before_the_event(tmp_path):
    """When a poll notices the silent GPU before its XID 79 is handled, the XID still ends up as the reason."""
    agent, sim, cluster, _ = _agent(tmp_path)
    sim.inject_xid(2, 79)
    agent.poll()  # the GPU is already unreadable; the event is still queued
    assert cluster.status["gpuHealth"][2]["reason"].startswith("GPU lost")
    agent.handle_event(_next_event(sim))
    assert cluster.status["gpuHealth"][2]["reason"].startswith("XID 79")


def test_cordon_annotation_is_followed(tmp_path):
    """GPUs named in the cordon annotation are cordoned, and uncordoned when it goes away."""
    agent, _, cluster, _ = _agent(tmp_path)
    cluster.node_annotations[CORDON_ANNOTATION] = agent.topology.gpus[4].uuid
    agent.poll()
    assert _cordoned(cluster) == [i == 4 for i in range(8)]
    assert [e.reason for e in cluster.events] == ["GpuCordonChanged"]
    del cluster.node_annotations[CORDON_ANNOTATION]
    agent.poll()
    assert _cordoned(cluster) == [False] * 8 and cluster.status["cordonProblems"] == []


def test_an_upper_case_cordon_cordons_the_gpu_whose_nvml_uuid_is_lower_case(tmp_path):
    """A cordon spelled `GPU-DA87D0C6-...` cordons the GPU that NVML names `GPU-da87d0c6-...`."""
    agent, _, cluster, _ = _agent(tmp_path)
    uuid = agent.topology.gpus[6].uuid
    assert uuid[4:] == uuid[4:].lower()
    cluster.node_annotations[CORDON_ANNOTATION] = "GPU-" + uuid[4:].upper()
    agent.poll()
    assert _cordoned(cluster) == [i == 6 for i in range(8)]
    assert cluster.status["cordonProblems"] == []
    assert agent.health()[6].cordoned and not agent.health()[6].usable


def test_junk_in_the_cordon_annotation_is_published_while_valid_uuids_stay_cordoned(tmp_path):
    """Junk entries are listed in cordonProblems and raised once as an event; the valid UUIDs are cordoned."""
    agent, _, cluster, _ = _agent(tmp_path)
    gpus = agent.topology.gpus
    absent = "GPU-00000000-0000-0000-0000-000000000000"
    cluster.node_annotations[CORDON_ANNOTATION] = f"{gpus[1].uuid},GPU-4,,{gpus[5].uuid},{absent}"
    agent.poll()
    agent.poll()
    assert _cordoned(cluster) == [i in (1, 5) for i in range(8)]
    problems = cluster.status["cordonProblems"]
    assert len(problems) == 3
    assert "'GPU-4' is not a GPU UUID" in problems[0] and "entry 3 is empty" in problems[1]
    assert absent in problems[2] and "not a GPU of this node" in problems[2]
    bad = [e for e in cluster.events if e.reason == "BadCordonAnnotation"]
    assert len(bad) == 1 and bad[0].warning and "GPU-4" in bad[0].message
    cluster.node_annotations[CORDON_ANNOTATION] = gpus[1].uuid
    agent.poll()
    assert cluster.status["cordonProblems"] == [] and _cordoned(cluster) == [i == 1 for i in range(8)]


def test_an_unreadable_node_keeps_the_previous_cordons(tmp_path):
    """When the node cannot be read, the cordons and their problems stay as they were."""
    agent, _, cluster, _ = _agent(tmp_path)
    cluster.node_annotations[CORDON_ANNOTATION] = f"{agent.topology.gpus[2].uuid},junk"
    agent.poll()
    cluster.fail_next = True  # the annotation read fails
    agent.poll()
    assert _cordoned(cluster)[2] is True and len(cluster.status["cordonProblems"]) == 1


def test_watchdog_reports_a_pod_over_its_share(tmp_path):
    """A pod using more memory than its share is reported once as an event and in the metrics."""
    agent, sim, cluster, _ = _agent(tmp_path)
    uid = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
    (tmp_path / "900").mkdir()
    (tmp_path / "900" / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/c1\n")
    allocation = Allocation(
        "n1", (GpuGrant(6, agent.topology.gpus[6].uuid, False, memory_mib=1024, units=10),)
    )
    cluster.pods = [
        PodInfo(
            "ml",
            "hungry",
            uid,
            "3",
            "n1",
            "Running",
            MappingProxyType({ALLOCATION_ANNOTATION: encode_allocation(allocation)}),
        )
    ]
    sim.set_process(6, 900, 4096 * MIB)
    agent.poll()
    agent.poll()
    over = [e for e in cluster.events if e.reason == "GpuMemoryOverShare"]
    assert len(over) == 1 and over[0].object_kind == "Pod" and over[0].name == "hungry"
    body, _ = agent.metrics.render()
    assert b'linkpack_pod_gpu_memory_used_bytes{gpu="6",namespace="ml",pod="hungry"} 4.294967296e+09' in body


def test_rediscovery_keeps_the_old_view_when_nvml_goes_missing(tmp_path):
    """A rediscovery that lost NVML keeps the old topology; a real change replaces it and the spec."""
    agent, sim, cluster, clock = _agent(tmp_path, rediscover_interval_s=100)
    agent.poll()
    before = agent.topology
    sim.set_gpu_lost(0)  # NVML can no longer name every GPU: discovery would fall back to topo -m
    clock.advance(100)
    agent.poll()
    assert agent.topology is before and cluster.spec_writes == 1
    sim.set_gpu_lost(0, False)
    sim.set_nvlink_active(0, 0, False)  # a real change: GPU0's link count drops
    clock.advance(100)
    agent.poll()
    assert agent.topology is not before and cluster.spec_writes == 2


def test_without_a_cluster_the_agent_still_tracks_health(tmp_path):
    """Without an API the agent still tracks GPU health and polls."""
    config = AgentConfig(node_name="n1", proc_root=tmp_path)
    sim = SimulatedNvml(catalog_machine("dgx1-v100"))
    agent = Agent(config, sim, None, AgentMetrics())
    sim.inject_xid(0, 74)
    agent.handle_event(_next_event(sim))
    assert not agent.health()[0].healthy
    agent.poll()


def test_run_loop_handles_events_from_another_thread_and_stops(tmp_path):
    """The loop handles an event injected from another thread and stops when told."""
    agent, sim, _cluster, _ = _agent(tmp_path, poll_interval_s=0.05)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,))
    loop.start()
    sim.inject_xid(7, 94)
    deadline = time.monotonic() + 10
    while agent.health()[7].healthy and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    loop.join(timeout=10)
    assert not loop.is_alive()
    assert not agent.health()[7].healthy


def test_state_shows_the_topology_its_sources_and_the_status(tmp_path):
    """The debug state has the topology, where each fact came from, and the status as published."""
    agent, _, _, _ = _agent(tmp_path)
    state = agent.state()
    assert state["node"] == "n1" and state["sources"]["links"] == "nvml (simulated)"
    assert state["status"]["gpuCount"] == 8 and len(state["status"]["gpuHealth"]) == 8
    assert "heartbeat" not in state["status"]


@pytest.mark.timeout(30)
def test_an_interposer_share_over_its_cap_is_reported_with_its_level(tmp_path):
    """A share held by the interposer found over its cap is reported with its enforcement level in the event and the metric."""
    agent, sim, cluster, _ = _agent(tmp_path)
    uid = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
    (tmp_path / "901").mkdir()
    (tmp_path / "901" / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/c1\n")
    grant = GpuGrant(5, agent.topology.gpus[5].uuid, False, memory_mib=1024, units=10)
    allocation = Allocation("n1", (grant,), enforcement=Enforcement.INTERPOSER)
    annotations = MappingProxyType({ALLOCATION_ANNOTATION: encode_allocation(allocation)})
    cluster.pods = [PodInfo("ml", "held", uid, "3", "n1", "Running", annotations)]
    sim.set_process(5, 901, 4096 * MIB)
    agent.poll()
    (over,) = [e for e in cluster.events if e.reason == "GpuMemoryOverShare"]
    assert "its record's enforcement is interposer" in over.message
    body, _ = agent.metrics.render()
    assert (
        b'linkpack_pod_gpu_memory_over_limit_total{enforcement="interposer",gpu="5",namespace="ml",pod="held"} 1.0'
        in body
    )


@pytest.mark.timeout(30)
def test_the_status_says_interposer_available_as_the_delivery_reports_it(tmp_path):
    """The published status carries interposer.available as the wiring's delivery check answers it at each poll."""
    agent, _, cluster, clock = _agent(tmp_path)
    installed = {"now": True}
    agent.interposer_ready = lambda: installed["now"]
    agent.poll()
    assert cluster.status["interposer"] == {"available": True}
    installed["now"] = False
    clock.advance(1)
    agent.poll()
    assert cluster.status["interposer"] == {"available": False}
