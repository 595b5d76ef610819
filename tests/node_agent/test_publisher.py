"""The GpuTopology is written only when something changed, and on heartbeats."""

from __future__ import annotations

from dataclasses import replace

from contract.gpu_topology import TopologyStatus
from node_agent.health import GpuHealth, Severity
from node_agent.loop.publisher import Published, Publisher, node_status, plan_publish
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.support.machines import catalog_machine
from topology.codec import content_hash


def _health(healthy: bool = True) -> tuple[GpuHealth, ...]:
    return (
        GpuHealth(
            0,
            "GPU-0",
            healthy,
            "" if healthy else "XID 48",
            1000.0,
            None if healthy else Severity.NEEDS_RESET,
        ),
    )


def _status(healthy: bool = True, topology_name: str = "hgx-h100", **extra) -> TopologyStatus:
    return node_status(catalog_machine(topology_name), _health(healthy), "1.0", **extra)


def test_plan_is_pure_and_explains_itself():
    """The plan says what to write and why, from what was published and what is current."""
    status = _status()
    assert plan_publish(Published(), "h1", status, 0, 30).why == "new record"
    current = Published("h1", status, 100.0)
    assert plan_publish(current, "h2", status, 101, 30).why == "topology changed"
    assert plan_publish(current, "h1", status, 129, 30).why == "up to date"
    assert plan_publish(current, "h1", status, 130, 30).why == "heartbeat"
    assert plan_publish(current, "h1", _status(False), 101, 30).why == "status changed"
    assert plan_publish(current, "h1", _status(cordon_problems=("x",)), 101, 30).why == "status changed"
    assert plan_publish(current, "h1", replace(status, heartbeat="t"), 101, 30).why == "up to date"
    assert plan_publish(Published("h1"), "h1", status, 101, 30).why == "first status"


def test_the_status_carries_the_gpu_count_mps_and_cordon_problems():
    """The published status has the GPU count (the CRD's printer column), MPS state and cordon problems."""
    cluster = FakeNodeApi()
    pub = Publisher(cluster, "n1", clock=FakeClock())
    topo = catalog_machine("hgx-h100")
    pub.publish(
        topo, node_status(topo, _health(), "1.0", mps_active=True, cordon_problems=("entry 2 is empty",))
    )
    assert cluster.status["gpuCount"] == 8 == topo.gpu_count
    assert cluster.status["mps"] == {"active": True}
    assert cluster.status["cordonProblems"] == ["entry 2 is empty"]
    assert cluster.status["agentVersion"] == "1.0" and cluster.status["heartbeat"].endswith("Z")


def test_spec_is_written_once_then_only_on_hash_change():
    """The spec is written on the first publish and then only when the topology's hash changes."""
    cluster, clock = FakeNodeApi(), FakeClock()
    pub = Publisher(cluster, "n1", heartbeat_interval_s=30, clock=clock)
    topo = catalog_machine("hgx-h100")
    outcome = pub.publish(topo, _status())
    assert outcome.wrote_spec and outcome.wrote_status
    assert cluster.spec_hash == content_hash(topo)
    for _ in range(5):
        clock.advance(1)
        assert not pub.publish(topo, _status()).wrote_spec
    assert (cluster.spec_writes, cluster.status_writes) == (1, 1)
    changed = replace(topo, gpus=(replace(topo.gpus[0], memory_mib=1), *topo.gpus[1:]))
    assert pub.publish(changed, _status()).wrote_spec
    assert cluster.spec_writes == 2


def test_warnings_alone_do_not_rewrite_the_spec():
    """New discovery warnings alone do not count as a topology change."""
    cluster = FakeNodeApi()
    pub = Publisher(cluster, "n1", clock=FakeClock())
    topo = catalog_machine("dgx-a100")
    pub.publish(topo, _status(topology_name="dgx-a100"))
    pub.publish(replace(topo, warnings=("something new",)), _status(topology_name="dgx-a100"))
    assert cluster.spec_writes == 1


def test_health_changes_are_written_promptly_and_heartbeats_on_interval():
    """A health change is written on the next publish; an unchanged status only on the heartbeat interval."""
    cluster, clock = FakeNodeApi(), FakeClock()
    pub = Publisher(cluster, "n1", heartbeat_interval_s=30, clock=clock)
    topo = catalog_machine("dgx1-v100")
    pub.publish(topo, _status(topology_name="dgx1-v100"))
    clock.advance(1)
    assert pub.publish(topo, _status(False, "dgx1-v100")).plan.why == "status changed"
    assert cluster.status["gpuHealth"][0]["healthy"] is False
    assert cluster.status["gpuHealth"][0]["severity"] == "needs-reset"
    clock.advance(29)
    assert not pub.publish(topo, _status(False, "dgx1-v100")).wrote_status
    clock.advance(1)
    assert pub.publish(topo, _status(False, "dgx1-v100")).plan.why == "heartbeat"
    assert cluster.status["heartbeat"].endswith("Z") and cluster.status["agentVersion"] == "1.0"
    assert cluster.spec_writes == 1 and cluster.status_writes == 3


def test_an_existing_record_with_the_same_hash_is_not_rewritten_after_restart():
    """A restarted agent reads the existing object back and does not rewrite an unchanged spec."""
    cluster = FakeNodeApi()
    topo = catalog_machine("hgx-h100")
    Publisher(cluster, "n1", clock=FakeClock()).publish(topo, _status())
    restarted = Publisher(cluster, "n1", clock=FakeClock())
    assert restarted.load_existing() == content_hash(topo)
    outcome = restarted.publish(topo, _status())
    assert not outcome.wrote_spec and outcome.wrote_status
    assert cluster.spec_writes == 1


def test_failed_writes_are_retried_on_the_next_tick():
    """A failed write leaves nothing remembered, so the next publish writes again."""
    cluster, clock = FakeNodeApi(), FakeClock()
    pub = Publisher(cluster, "n1", clock=clock)
    topo = catalog_machine("hgx-h100")
    cluster.fail_next = True
    outcome = pub.publish(topo, _status())
    assert outcome.error and "HTTP 500" in outcome.error and cluster.spec_writes == 0
    assert pub.publish(topo, _status()).wrote_spec
    cluster.fail_next = True
    clock.advance(1)
    failed = pub.publish(topo, _status(False))
    assert failed.error and not failed.wrote_status
    assert pub.publish(topo, _status(False)).wrote_status
