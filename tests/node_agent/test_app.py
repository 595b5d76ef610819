"""The agent loop end to end over a simulated NVML and an in-memory cluster."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from types import MappingProxyType

import pytest

from node_agent.agent_http import serve_http
from node_agent.app import Agent, main, simulated_topo_text, start_device_plugins
from node_agent.config import AgentConfig, parse_args
from node_agent.health import CORDON_ANNOTATION
from node_agent.kube import PodInfo
from node_agent.metrics import AgentMetrics
from node_agent.nvml_reader import XidEvent
from node_agent.nvml_simulated import SimulatedNvml
from tests.node_agent.machines import FakeClock, FakeCluster, machine, topo_text
from topology.allocation import ALLOCATION_ANNOTATION, Allocation, encode_allocation
from topology.workload import GpuGrant

MIB = 1024 * 1024


def _agent(tmp_path, name="hgx-h100", **overrides):
    config = AgentConfig(node_name="n1", recheck_after_s=60, proc_root=tmp_path, **overrides)
    sim = SimulatedNvml(machine(name), node_name="n1")
    cluster, clock = FakeCluster(), FakeClock()
    text = topo_text(name)
    agent = Agent(config, sim, cluster, AgentMetrics(), lambda: text, clock)
    return agent, sim, cluster, clock


def _next_event(sim: SimulatedNvml) -> XidEvent:
    event = sim.wait_event(0)
    assert event is not None
    return event


def _healthy(cluster):
    return [g["healthy"] for g in cluster.status["gpuHealth"]]


def test_first_poll_publishes_the_record_and_a_healthy_status(tmp_path):
    agent, _, cluster, _ = _agent(tmp_path)
    agent.poll()
    assert cluster.record is not None and cluster.record["contentHash"] == cluster.record_hash
    assert len(cluster.record["gpus"]) == 8 and cluster.record["nvswitch"] is True
    assert _healthy(cluster) == [True] * 8
    body, _ = agent.metrics.render()
    assert b'linkpack_gpu_healthy{gpu="0"' in body and b"linkpack_gpu_memory_total_bytes" in body


def test_xid_marks_unhealthy_promptly_and_recovers_after_recheck(tmp_path):
    agent, sim, cluster, clock = _agent(tmp_path)
    agent.poll()
    sim.inject_xid(3, 48)
    event = sim.wait_event(0)
    assert event is not None
    agent.handle_event(event)
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
    agent, sim, cluster, _ = _agent(tmp_path)
    agent.poll()
    writes = cluster.status_writes
    sim.inject_xid(1, 13)
    event = sim.wait_event(0)
    assert event is not None
    agent.handle_event(event)
    assert _healthy(cluster)[1] is True and cluster.status_writes == writes and cluster.events == []


def test_ecc_fault_holds_until_cleared_then_recovers(tmp_path):
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


def test_lost_gpu_is_fatal_and_stays_out(tmp_path):
    agent, sim, cluster, clock = _agent(tmp_path)
    agent.poll()
    sim.inject_xid(2, 79)
    agent.handle_event(_next_event(sim))
    clock.advance(10_000)
    agent.poll()
    entry = cluster.status["gpuHealth"][2]
    assert entry["healthy"] is False and entry["severity"] == "fatal"


def test_cordon_annotation_is_followed_and_bad_values_reported_once(tmp_path):
    agent, _, cluster, _ = _agent(tmp_path)
    uuid = agent.topology.gpus[4].uuid
    cluster.node_annotations[CORDON_ANNOTATION] = uuid
    agent.poll()
    assert cluster.status["gpuHealth"][4]["cordoned"] is True
    cluster.node_annotations[CORDON_ANNOTATION] = "GPU-4,,"
    agent.poll()
    agent.poll()
    assert [e.reason for e in cluster.events].count("BadCordonAnnotation") == 1
    assert cluster.status["gpuHealth"][4]["cordoned"] is True  # the previous cordons stand
    del cluster.node_annotations[CORDON_ANNOTATION]
    agent.poll()
    assert cluster.status["gpuHealth"][4]["cordoned"] is False


def test_watchdog_reports_a_pod_over_its_share(tmp_path):
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
    config = AgentConfig(node_name="n1", proc_root=tmp_path)
    sim = SimulatedNvml(machine("dgx1-v100"))
    agent = Agent(config, sim, None, AgentMetrics())
    sim.inject_xid(0, 74)
    agent.handle_event(_next_event(sim))
    assert not agent.health()[0].healthy
    agent.poll()


def test_run_loop_handles_events_from_another_thread_and_stops(tmp_path):
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


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post(url: str, doc: object) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_http_endpoints_and_fault_injection(tmp_path):
    agent, sim, _, _ = _agent(tmp_path)
    agent.poll()
    server = serve_http(agent, sim, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(base + "/healthz") == (200, b"ok\n")
        status, body = _get(base + "/metrics")
        assert status == 200 and b"linkpack_gpu_healthy" in body
        status, body = _get(base + "/debug/state")
        state = json.loads(body)
        assert (
            status == 200 and state["sources"]["links"] == "nvml (simulated)" and len(state["gpuHealth"]) == 8
        )
        assert _post(base + "/debug/inject", {"gpu": 2, "xid": 48}) == (
            200,
            {"applied": "GPU 2: XID 48 injected"},
        )
        assert sim.wait_event(0) is not None
        code, doc = _post(base + "/debug/inject", {"gpu": 2})
        assert code == 400 and "exactly one of" in doc["error"] and "POST a JSON object" in doc["help"]
        assert _get(base + "/nope")[0] == 404
    finally:
        server.shutdown()


def test_fault_injection_is_refused_on_real_hardware(tmp_path):
    agent, _, _, _ = _agent(tmp_path)
    server = serve_http(agent, None, "127.0.0.1", 0)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.server_address[1]}/debug/inject", data=b"{}", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=5)
        assert err.value.code == 404
    finally:
        server.shutdown()


def test_print_discovery_in_simulate_mode(capsys):
    assert main(["--simulate", "dgx-a100", "--print-discovery", "--log-level", "ERROR"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["node"] == "sim-dgx-a100"
    assert state["sources"]["nics"] == "nvidia-smi topo -m"  # simulate mode merges the capture too
    assert len(state["topology"]["gpus"]) == 8


def test_unknown_simulated_machine_fails_cleanly(capsys):
    assert main(["--simulate", "no-such-machine", "--print-discovery", "--log-level", "CRITICAL"]) == 2


def test_simulated_topo_text_for_names_and_files(tmp_path):
    assert "GPU0" in (simulated_topo_text("hgx-h100") or "")
    assert simulated_topo_text("dgx2") is None
    path = tmp_path / "m.txt"
    path.write_text("x")
    assert simulated_topo_text(str(path)) == "x"


def test_device_plugin_hook_is_a_no_op_for_now():
    assert start_device_plugins.__doc__ and "HOOK" in start_device_plugins.__doc__


def test_config_parsing():
    config = parse_args(["--simulate", "hgx-h100", "--xid-severity", "31=needs-reset", "--no-kube"], env={})
    assert config.node_name == "sim-hgx-h100" and not config.use_kube and config.simulated
    assert dict(config.xid_overrides) == {31: "needs-reset"}
    assert parse_args([], env={"NODE_NAME": "gpu-7"}).node_name == "gpu-7"
    with pytest.raises(SystemExit):
        parse_args(["--xid-severity", "31=bad"], env={})
    with pytest.raises(SystemExit):
        parse_args(["--poll-interval", "0"], env={})
