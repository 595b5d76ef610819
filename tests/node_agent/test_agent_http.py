"""The agent's HTTP endpoints: metrics, health, debug state and simulated fault injection."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from node_agent.config import AgentConfig
from node_agent.loop.agent_http import serve_http
from node_agent.loop.agent_loop import Agent
from node_agent.metrics import AgentMetrics
from node_agent.sources.nvml_simulated import SimulatedNvml
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.support.machines import catalog_machine, topo_text


def _agent(tmp_path) -> tuple[Agent, SimulatedNvml]:
    sim = SimulatedNvml(catalog_machine("hgx-h100"), node_name="n1")
    text = topo_text("hgx-h100")
    config = AgentConfig(node_name="n1", proc_root=tmp_path)
    return Agent(config, sim, FakeNodeApi(), AgentMetrics(), lambda: text, FakeClock()), sim


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read()


def _post(url: str, doc: object) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read() or b"{}")


def test_http_endpoints_and_fault_injection(tmp_path):
    """Metrics, health and state are served, and a fault command reaches the simulated NVML."""
    agent, sim = _agent(tmp_path)
    agent.poll()
    server = serve_http(agent, sim, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(base + "/healthz") == (200, b"ok\n")
        status, body = _get(base + "/metrics")
        assert status == 200 and b"linkpack_gpu_healthy" in body
        status, body = _get(base + "/debug/state")
        state = json.loads(body)
        assert status == 200 and state["sources"]["links"] == "nvml (simulated)"
        assert len(state["status"]["gpuHealth"]) == 8 and state["status"]["gpuCount"] == 8
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
        server.server_close()


def test_fault_injection_is_refused_on_real_hardware(tmp_path):
    """Without a simulation, POST /debug/inject is not found."""
    agent, _ = _agent(tmp_path)
    server = serve_http(agent, None, "127.0.0.1", 0)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.server_address[1]}/debug/inject", data=b"{}", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=5)
        err.value.close()
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
