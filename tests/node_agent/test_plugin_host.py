"""DevicePluginHost and the framework shim install, with a fake kubelet over real gRPC."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from contract.resources import ResourceNames
from node_agent.deviceplugin.plugin_host import (
    SHIM_FILES,
    DevicePluginHost,
    DevicePluginSettings,
    install_shim,
    prepare_shim,
    unavailable_devices,
)
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from node_agent.deviceplugin.server import PluginConfig
from node_agent.health import GpuHealth
from node_agent.metrics import AgentMetrics, DevicePluginStats
from tests.support.machines import catalog_machine
from tests.support.resources import GPU, SHARED, mig_resource
from topology.model import MigDevice, MigMode, NodeTopology

from .fake_kubelet import FakeKubelet, wait_until

pytestmark = pytest.mark.timeout(60)

SHIM_SOURCE = Path(__file__).resolve().parents[2] / "node_agent" / "sharing" / "shim"


def _with_mig(topology: NodeTopology, index: int = 0) -> NodeTopology:
    gpu = topology.gpus[index]
    migs = tuple(
        MigDevice(
            f"MIG-{gpu.uuid[4:]}-{k}",
            "3g.40gb",
            gpu_instance_id=k + 1,
            compute_instance_id=0,
            memory_mib=40192,
        )
        for k in range(2)
    )
    changed = replace(gpu, mig_mode=MigMode.ENABLED, mig_devices=migs)
    return replace(topology, gpus=tuple(changed if g.index == index else g for g in topology.gpus))


def _health(
    topology: NodeTopology, unhealthy: int | None = None, cordoned: int | None = None
) -> list[GpuHealth]:
    return [
        GpuHealth(g.index, g.uuid, healthy=g.index != unhealthy, cordoned=g.index == cordoned)
        for g in topology.gpus
    ]


# ---------------------------------------------------------------------- the shim


def test_install_shim_copies_the_files_once_and_repairs_changed_ones(tmp_path: Path) -> None:
    """The shim files are copied once, left alone when unchanged and replaced when changed."""
    target = tmp_path / "var" / "shim"
    install_shim(target)
    assert sorted(p.name for p in target.iterdir()) == sorted(SHIM_FILES)
    for name in SHIM_FILES:
        assert (target / name).read_bytes() == (SHIM_SOURCE / name).read_bytes()
        assert (target / name).stat().st_mode & 0o777 == 0o644
    first = (target / "linkpack_shim.py").stat().st_ino
    install_shim(target)
    assert (target / "linkpack_shim.py").stat().st_ino == first  # unchanged files are left alone
    (target / "sitecustomize.py").write_text("# stale\n")
    install_shim(target)
    assert (target / "sitecustomize.py").read_bytes() == (SHIM_SOURCE / "sitecustomize.py").read_bytes()
    assert not [p for p in target.iterdir() if p.name.startswith(".")]


def test_prepare_shim_leaves_the_shim_out_when_it_cannot_be_installed(tmp_path: Path) -> None:
    """When the shim cannot be installed the plugins go on without it."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert prepare_shim(str(blocker / "shim")) is None
    assert prepare_shim(None) is None
    assert prepare_shim(str(tmp_path / "ok")) == str(tmp_path / "ok")


# ---------------------------------------------------------------------- health


def test_unhealthy_and_cordoned_gpus_take_their_mig_instances_along() -> None:
    """Unhealthy and cordoned GPUs are unavailable together with their MIG instances."""
    topology = _with_mig(catalog_machine("hgx-h100"), 0)
    gpus = topology.gpus
    assert unavailable_devices(topology, _health(topology)) == frozenset()
    sick = unavailable_devices(topology, _health(topology, unhealthy=0, cordoned=4))
    assert sick == {gpus[0].uuid, *(m.uuid for m in gpus[0].mig_devices), gpus[4].uuid}


# ---------------------------------------------------------------------- the host


def _host(plugin_dir: Path, resources: ResourceNames | None = None) -> DevicePluginHost:
    settings = DevicePluginSettings(
        plugin=PluginConfig(plugin_dir=str(plugin_dir), pod_resources_socket=None, poll_interval_s=0.05),
        units_per_gpu=2,
        resources=resources or ResourceNames(),
    )
    return DevicePluginHost(settings, InMemoryPodRecords())


def test_the_host_restarts_the_plugins_when_the_offered_gpus_change(plugin_dir: Path) -> None:
    """The host restarts the plugins only when the offered GPUs change, keeping its counters."""
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    host = _host(plugin_dir)
    topology = catalog_machine("hgx-h100")
    try:
        assert host.start(topology, _health(topology))
        wait_until(lambda: len(kubelet.registered) == 2)
        first = host.plugins
        counters = host.counters
        host.update(topology, _health(topology, unhealthy=2))
        host.update(replace(topology), _health(topology))  # rediscovered, nothing changed
        assert host.plugins is first
        assert first is not None and first.health.current()[1] == frozenset()
        mig = _with_mig(topology, 1)
        host.update(mig, _health(mig, unhealthy=1))
        wait_until(lambda: len(kubelet.registered) == 5)
        assert host.plugins is not first and host.plugins is not None
        assert set(host.plugins.resources) == {
            GPU,
            SHARED,
            mig_resource("3g.40gb"),
        }
        assert {r.resource_name for r in kubelet.registered[2:]} == set(host.plugins.resources)
        assert host.plugins.health.current()[1] == {
            mig.gpus[1].uuid,
            *(m.uuid for m in mig.gpus[1].mig_devices),
        }
        # the kubelet records a registration before the plugin's Register call returns and counts it
        wait_until(lambda: host.stats().registrations == 5)
        stats = host.stats()
        assert (stats.resources, stats.registrations) == (3, 5) and host.counters is counters
    finally:
        host.stop()
        kubelet.stop()
    assert host.stats().resources == 0 and host.stats().registrations == 5
    assert not any(plugin_dir.glob("linkpack-*.sock"))


def test_the_host_does_not_start_without_gpus_or_a_plugin_directory(plugin_dir: Path, tmp_path: Path) -> None:
    """The host does not start without GPUs or a plugin directory, but does before the kubelet is up."""
    assert not _host(plugin_dir).start(NodeTopology(gpus=()), [])
    topology = catalog_machine("dgx1-v100")
    assert not _host(tmp_path / "missing").start(topology, _health(topology))
    host = _host(plugin_dir)
    assert host.start(topology, _health(topology))  # no kubelet yet: serving, registration pending
    try:
        assert host.stats().resources == 2 and host.stats().registrations == 0
    finally:
        host.stop()


def test_the_host_serves_the_configured_resource_names(plugin_dir: Path) -> None:
    """Resource names configured for the cluster are the ones registered with the kubelet."""
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    names = ResourceNames(whole="example.com/gpu", shared_units="example.com/gpu.shared")
    host = _host(plugin_dir, names)
    topology = catalog_machine("dgx1-v100")
    try:
        assert host.start(topology, _health(topology))
        wait_until(lambda: len(kubelet.registered) == 2)
        assert {r.resource_name for r in kubelet.registered} == {"example.com/gpu", "example.com/gpu.shared"}
    finally:
        host.stop()
        kubelet.stop()


@pytest.mark.timeout(10)
def test_enforcement_fallbacks_and_applied_levels_are_exported() -> None:
    """The device plugins' fallbacks (by the record's level) and handouts (by the level applied) appear on the agent's metrics."""
    metrics = AgentMetrics()
    stats = DevicePluginStats(
        allocations=3,
        enforcement_disagreements=1,
        fallbacks=(("interposer", 1),),
        applied=(("cooperative", 1), ("interposer", 2)),
    )
    metrics.watch_device_plugins(lambda: stats)
    body = metrics.render()[0].decode()
    assert 'linkpack_agent_allocation_mismatches_total{kind="enforcement"} 1.0' in body
    assert 'linkpack_agent_enforcement_fallbacks_total{recorded="interposer"} 1.0' in body
    assert 'linkpack_agent_allocations_by_enforcement_total{enforcement="interposer"} 2.0' in body
    assert 'linkpack_agent_allocations_by_enforcement_total{enforcement="cooperative"} 1.0' in body
