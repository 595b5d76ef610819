"""The GpuTopology record is written only when something changed, and on heartbeats."""

from __future__ import annotations

from dataclasses import replace

from node_agent.health import GpuHealth, Severity
from node_agent.publisher import Published, Publisher, plan_publish, status_body
from tests.node_agent.machines import FakeClock, FakeCluster, machine
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


def test_plan_is_pure_and_explains_itself():
    body = status_body(_health(), "1.0")
    assert plan_publish(Published(), "h1", body, 0, 30).why == "new record"
    current = Published("h1", body, 100.0)
    assert plan_publish(current, "h2", body, 101, 30).why == "topology changed"
    assert plan_publish(current, "h1", body, 129, 30).why == "up to date"
    assert plan_publish(current, "h1", body, 130, 30).why == "heartbeat"
    changed = status_body(_health(False), "1.0")
    assert plan_publish(current, "h1", changed, 101, 30).why == "health changed"
    assert plan_publish(Published("h1"), "h1", body, 101, 30).why == "first status"


def test_spec_is_written_once_then_only_on_hash_change():
    cluster, clock = FakeCluster(), FakeClock()
    pub = Publisher(cluster, "n1", "1.0", heartbeat_interval_s=30, clock=clock)
    topo = machine("hgx-h100")
    outcome = pub.publish(topo, _health())
    assert outcome.wrote_spec and outcome.wrote_status
    assert cluster.record_hash == content_hash(topo)
    for _ in range(5):
        clock.advance(1)
        assert not pub.publish(topo, _health()).wrote_spec
    assert (cluster.spec_writes, cluster.status_writes) == (1, 1)
    changed = replace(topo, gpus=(replace(topo.gpus[0], memory_mib=1), *topo.gpus[1:]))
    assert pub.publish(changed, _health()).wrote_spec
    assert cluster.spec_writes == 2


def test_warnings_alone_do_not_rewrite_the_spec():
    cluster = FakeCluster()
    pub = Publisher(cluster, "n1", "1.0", clock=FakeClock())
    topo = machine("dgx-a100")
    pub.publish(topo, _health())
    pub.publish(replace(topo, warnings=("something new",)), _health())
    assert cluster.spec_writes == 1


def test_health_changes_are_written_promptly_and_heartbeats_on_interval():
    cluster, clock = FakeCluster(), FakeClock()
    pub = Publisher(cluster, "n1", "1.0", heartbeat_interval_s=30, clock=clock)
    topo = machine("dgx1-v100")
    pub.publish(topo, _health())
    clock.advance(1)
    assert pub.publish(topo, _health(False)).plan.why == "health changed"
    assert cluster.status["gpuHealth"][0]["healthy"] is False
    assert cluster.status["gpuHealth"][0]["severity"] == "needs-reset"
    clock.advance(29)
    assert not pub.publish(topo, _health(False)).wrote_status
    clock.advance(1)
    assert pub.publish(topo, _health(False)).plan.why == "heartbeat"
    assert cluster.status["heartbeat"].endswith("Z") and cluster.status["agentVersion"] == "1.0"
    assert cluster.spec_writes == 1 and cluster.status_writes == 3


def test_an_existing_record_with_the_same_hash_is_not_rewritten_after_restart():
    cluster = FakeCluster()
    topo = machine("hgx-h100")
    Publisher(cluster, "n1", "1.0", clock=FakeClock()).publish(topo, _health())
    restarted = Publisher(cluster, "n1", "1.0", clock=FakeClock())
    assert restarted.load_existing() == content_hash(topo)
    outcome = restarted.publish(topo, _health())
    assert not outcome.wrote_spec and outcome.wrote_status
    assert cluster.spec_writes == 1


def test_failed_writes_are_retried_on_the_next_tick():
    cluster, clock = FakeCluster(), FakeClock()
    pub = Publisher(cluster, "n1", "1.0", clock=clock)
    topo = machine("hgx-h100")
    cluster.fail_next = True
    outcome = pub.publish(topo, _health())
    assert outcome.error and "HTTP 500" in outcome.error and cluster.spec_writes == 0
    assert pub.publish(topo, _health()).wrote_spec
    cluster.fail_next = True
    clock.advance(1)
    failed = pub.publish(topo, _health(False))
    assert failed.error and not failed.wrote_status
    assert pub.publish(topo, _health(False)).wrote_status
