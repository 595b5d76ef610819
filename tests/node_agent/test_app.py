"""The agent loop end to end over a simulated NVML and an in-memory cluster."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import MappingProxyType

import pytest

from node_agent.agent_http import serve_http
from node_agent.app import Agent, DevicePluginContext, main, simulated_topo_text, start_device_plugins
from node_agent.config import DEFAULT_SHIM_HOST_DIR, AgentConfig, parse_args
from node_agent.deviceplugin._generated import deviceplugin_pb2 as api
from node_agent.deviceplugin.inventory import WHOLE_GPU_RESOURCE
from node_agent.health import CORDON_ANNOTATION
from node_agent.kube import ContainerRequests, PodInfo
from node_agent.metrics import AgentMetrics
from node_agent.nvml_reader import XidEvent
from node_agent.nvml_simulated import SimulatedNvml
from tests.node_agent.fake_kubelet import FakeKubelet, plugin_stub, wait_until
from tests.node_agent.machines import FakeClock, FakeCluster, machine, topo_text
from topology.allocation import (
    ALLOCATION_ANNOTATION,
    CONSUMED_ANNOTATION,
    Allocation,
    decode_consumption,
    encode_allocation,
)
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


def _context(agent: Agent, sim: SimulatedNvml | None, cluster: FakeCluster | None) -> DevicePluginContext:
    return DevicePluginContext(agent.config, agent, sim, cluster, threading.Event())


def _unhealthy(answer) -> set[str]:
    return {d.ID for d in answer.devices if d.health == "Unhealthy"}


@pytest.mark.timeout(60)
def test_device_plugins_serve_the_agents_gpus_follow_its_health_and_count(tmp_path, plugin_dir: Path):
    shim = tmp_path / "host" / "shim"
    agent, sim, cluster, _ = _agent(
        tmp_path,
        device_plugin_dir=str(plugin_dir),
        pod_resources_socket=None,
        shim_host_dir=str(shim),
        units_per_gpu=4,
    )
    gpus = agent.topology.gpus
    record = Allocation("n1", (GpuGrant(6, gpus[6].uuid, True),), resources=((WHOLE_GPU_RESOURCE, 1),))
    cluster.pods = [
        PodInfo(
            "ml",
            "train",
            "uid-train",
            "5",
            "n1",
            "Running",
            MappingProxyType({ALLOCATION_ANNOTATION: encode_allocation(record)}),
            (ContainerRequests("main", ((WHOLE_GPU_RESOURCE, 1),)),),
        )
    ]
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    agent.poll()
    stop = start_device_plugins(_context(agent, sim, cluster))
    assert stop is not None
    try:
        wait_until(lambda: len(kubelet.registered) == 2)
        assert sorted(p.name for p in shim.iterdir()) == ["linkpack_shim.py", "sitecustomize.py"]
        channel, client = plugin_stub(plugin_dir, WHOLE_GPU_RESOURCE)
        with channel:
            stream = client.ListAndWatch(api.Empty(), timeout=30)
            first = next(stream)
            assert [d.ID for d in first.devices] == [g.uuid for g in gpus] and not _unhealthy(first)
            sim.inject_xid(3, 79)
            agent.handle_event(_next_event(sim))
            assert _unhealthy(next(stream)) == {gpus[3].uuid}
            cluster.node_annotations[CORDON_ANNOTATION] = gpus[5].uuid
            agent.poll()
            assert _unhealthy(next(stream)) == {gpus[3].uuid, gpus[5].uuid}
            stream.cancel()
            answer = client.Allocate(
                api.AllocateRequest(
                    container_requests=[api.ContainerAllocateRequest(devices_ids=[gpus[6].uuid])]
                ),
                timeout=10,
            )
        assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpus[6].uuid
        consumed = decode_consumption(cluster.pods[0].annotations[CONSUMED_ANNOTATION])
        assert consumed.containers == ("main",) and consumed.device_ids == (gpus[6].uuid,)
        body, _ = agent.metrics.render()
        assert b'linkpack_agent_allocations_total{result="granted"} 1.0' in body
        assert b'linkpack_agent_allocations_total{result="refused"} 0.0' in body
        assert b"linkpack_agent_device_plugin_resources 2.0" in body
        assert b"linkpack_agent_device_plugin_registrations_total 2.0" in body
    finally:
        stop()
        kubelet.stop()
    assert not any(plugin_dir.glob("linkpack-*.sock"))


def test_device_plugins_are_off_when_disabled_without_a_cluster_or_a_kubelet(tmp_path):
    agent, sim, cluster, _ = _agent(tmp_path, device_plugin=False)
    assert start_device_plugins(_context(agent, sim, cluster)) is None
    agent, sim, cluster, _ = _agent(
        tmp_path, device_plugin_dir=str(tmp_path / "no-kubelet"), shim_host_dir=str(tmp_path / "shim")
    )
    assert start_device_plugins(_context(agent, sim, None)) is None
    assert not (tmp_path / "shim").exists()  # nothing is installed for plugins that are off
    assert start_device_plugins(_context(agent, sim, cluster)) is None  # logged; the agent goes on
    assert not (tmp_path / "shim").exists()
    agent.poll()
    body, _ = agent.metrics.render()
    assert b"linkpack_agent_device_plugin_resources 0.0" in body


def test_config_parsing():
    config = parse_args(["--simulate", "hgx-h100", "--xid-severity", "31=needs-reset", "--no-kube"], env={})
    assert config.node_name == "sim-hgx-h100" and not config.use_kube and config.simulated
    assert dict(config.xid_overrides) == {31: "needs-reset"}
    assert parse_args([], env={"NODE_NAME": "gpu-7"}).node_name == "gpu-7"
    with pytest.raises(SystemExit):
        parse_args(["--xid-severity", "31=bad"], env={})
    with pytest.raises(SystemExit):
        parse_args(["--poll-interval", "0"], env={})


def test_device_plugin_flags():
    default = parse_args([], env={})
    assert default.device_plugin and default.units_per_gpu == 100 and default.mps_pipe_dir is None
    assert default.shim_host_dir == DEFAULT_SHIM_HOST_DIR == "/var/lib/linkpack/shim"
    assert default.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert default.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert not parse_args(["--no-device-plugin"], env={}).device_plugin
    assert not parse_args(["--no-kube"], env={}).device_plugin  # no records to serve without the API
    custom = parse_args(
        [
            "--device-plugin-dir=/dp",
            "--pod-resources-socket=",
            "--units-per-gpu=8",
            "--shim-host-dir=",
            "--mps-pipe-dir=/run/mps",
        ],
        env={},
    )
    assert (custom.device_plugin_dir, custom.pod_resources_socket, custom.units_per_gpu) == ("/dp", None, 8)
    assert custom.shim_host_dir is None and custom.mps_pipe_dir == "/run/mps"
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            parse_args(["--units-per-gpu", bad], env={})
