"""Building the agent from its configuration: sources, the whole process, and the device plugins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

import pytest

from contract.allocation import Allocation, decode_consumption, encode_allocation
from contract.keys import ALLOCATION_ANNOTATION, CONSUMED_ANNOTATION, CORDON_ANNOTATION
from node_agent.config import AgentConfig
from node_agent.deviceplugin._generated import deviceplugin_pb2 as api  # the kubelet's messages
from node_agent.kube.node_api import PodInfo
from node_agent.loop.agent_loop import Agent
from node_agent.metrics import AgentMetrics
from node_agent.sources.nvml_reader import XidEvent
from node_agent.sources.nvml_simulated import SimulatedNvml
from node_agent.sources.opening import open_sources, simulated_topo_text
from node_agent.wiring import main, start_device_plugins
from tests.node_agent.fake_kubelet import FakeKubelet, plugin_stub, wait_until
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.support.device_plugin import app
from tests.support.machines import catalog_machine, topo_text
from tests.support.resources import GPU
from topology.scheduling import GpuGrant

REPO = Path(__file__).resolve().parents[2]


def _agent(tmp_path, **overrides):
    config = AgentConfig(node_name="n1", recheck_after_s=60, proc_root=tmp_path, **overrides)
    sim = SimulatedNvml(catalog_machine("hgx-h100"), node_name="n1")
    cluster = FakeNodeApi()
    text = topo_text("hgx-h100")
    return Agent(config, sim, cluster, AgentMetrics(), lambda: text, FakeClock()), sim, cluster


def _next_event(sim: SimulatedNvml) -> XidEvent:
    event = sim.wait_event(0)
    assert event is not None
    return event


def _unhealthy(answer) -> set[str]:
    return {d.ID for d in answer.devices if d.health == "Unhealthy"}


def test_print_discovery_in_simulate_mode(capsys):
    """`--simulate --print-discovery` prints the merged topology of the simulated machine."""
    assert main(["--simulate", "dgx-a100", "--print-discovery", "--log-level", "ERROR"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["node"] == "sim-dgx-a100"
    assert state["sources"]["nics"] == "nvidia-smi topo -m"  # simulate mode merges the capture too
    assert len(state["topology"]["gpus"]) == 8


def test_unknown_simulated_machine_fails_cleanly(capsys):
    """An unknown simulated machine is a clean exit status 2, not a traceback."""
    assert main(["--simulate", "no-such-machine", "--print-discovery", "--log-level", "CRITICAL"]) == 2


def test_help_needs_neither_grpc_nor_the_kubernetes_client():
    """`python -m node_agent --help` works without importing gRPC or the Kubernetes client."""
    code = (
        "import sys; sys.modules['grpc'] = None; sys.modules['kubernetes'] = None; "
        "sys.argv = ['node_agent', '--help']; import runpy; runpy.run_module('node_agent', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--units-per-gpu" in done.stdout and "--mps-pipe-dir" in done.stdout


def test_simulated_topo_text_for_names_and_files(tmp_path):
    """A simulated machine's `topo -m` capture comes from the catalog or from the file itself."""
    assert "GPU0" in (simulated_topo_text("hgx-h100") or "")
    assert simulated_topo_text("dgx2") is None
    path = tmp_path / "m.txt"
    path.write_text("x")
    assert simulated_topo_text(str(path)) == "x"


def test_simulate_mode_opens_the_simulation_and_its_capture():
    """Simulate mode reads the simulated NVML and the machine's `topo -m` capture."""
    sources = open_sources("hgx-h100", "n1", use_smi=True, nvidia_smi="nvidia-smi")
    assert sources.reader is sources.simulated and sources.simulated is not None
    assert "GPU0" in (sources.topo_text() or "")


@pytest.mark.timeout(60)
def test_device_plugins_serve_the_agents_gpus_follow_its_health_and_count(tmp_path, plugin_dir: Path):
    """The plugins serve the agent's GPUs, follow its health and cordons, hand out records and count."""
    shim = tmp_path / "host" / "shim"
    agent, sim, cluster = _agent(
        tmp_path,
        device_plugin_dir=str(plugin_dir),
        pod_resources_socket=None,
        shim_host_dir=str(shim),
        units_per_gpu=4,
    )
    gpus = agent.topology.gpus
    record = Allocation("n1", (GpuGrant(6, gpus[6].uuid, True),), resources=((GPU, 1),))
    cluster.pods = [
        PodInfo(
            "ml",
            "train",
            "uid-train",
            "5",
            "n1",
            "Running",
            MappingProxyType({ALLOCATION_ANNOTATION: encode_allocation(record)}),
            (app("main", GPU, 1),),
        )
    ]
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    agent.poll()
    stop = start_device_plugins(agent.config, agent, cluster)
    assert stop is not None
    try:
        wait_until(lambda: len(kubelet.registered) == 2)
        assert sorted(p.name for p in shim.iterdir()) == ["linkpack_shim.py", "sitecustomize.py"]
        channel, client = plugin_stub(plugin_dir, GPU)
        with channel:
            stream = client.ListAndWatch(api.Empty(), timeout=30)
            first = next(stream)
            assert [d.ID for d in first.devices] == [g.uuid for g in gpus] and not _unhealthy(first)
            sim.inject_xid(3, 79)
            agent.handle_event(_next_event(sim))
            assert _unhealthy(next(stream)) == {gpus[3].uuid}
            cluster.node_annotations[CORDON_ANNOTATION] = gpus[5].uuid.upper()
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
        registered = b"linkpack_agent_device_plugin_registrations_total 2.0"
        wait_until(lambda: registered in agent.metrics.render()[0])  # counted once Register returns
    finally:
        stop()
        kubelet.stop()
    assert not any(plugin_dir.glob("linkpack-*.sock"))


def test_device_plugins_are_off_when_disabled_without_a_cluster_or_a_kubelet(tmp_path):
    """The plugins stay off (and install no shim) when disabled, without an API, or without a kubelet."""
    agent, _, cluster = _agent(tmp_path, device_plugin=False)
    assert start_device_plugins(agent.config, agent, cluster) is None
    agent, _, cluster = _agent(
        tmp_path, device_plugin_dir=str(tmp_path / "no-kubelet"), shim_host_dir=str(tmp_path / "shim")
    )
    assert start_device_plugins(agent.config, agent, None) is None
    assert not (tmp_path / "shim").exists()  # nothing is installed for plugins that are off
    assert start_device_plugins(agent.config, agent, cluster) is None  # logged; the agent goes on
    assert not (tmp_path / "shim").exists()
    agent.poll()
    body, _ = agent.metrics.render()
    assert b"linkpack_agent_device_plugin_resources 0.0" in body
