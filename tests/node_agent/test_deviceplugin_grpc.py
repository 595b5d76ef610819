"""The plugin servers over real unix-socket gRPC, driven by the generated v1beta1 client stubs.

A small fake kubelet (fake_kubelet.py) serves Registration and, like the real one, dials the
plugin back and asks for its options before Register returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from node_agent.deviceplugin._generated import deviceplugin_pb2 as api
from node_agent.deviceplugin._generated import deviceplugin_pb2_grpc as api_grpc
from node_agent.deviceplugin.broker import AllocationBroker
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.inventory import share_unit_id
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from node_agent.deviceplugin.server import DevicePlugins, PluginConfig, start_device_plugins

from .builders import SHARED_GPU, WHOLE_GPU, inventory, pod, share, uuid, whole
from .fake_kubelet import FakeKubelet, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store() -> InMemoryPodRecords:
    return InMemoryPodRecords(
        [pod("train", whole(2, 3), bound_at=1), pod("infer", share(1, 20480, 1), bound_at=2)]
    )


@pytest.fixture
def running(plugin_dir: Path, store: InMemoryPodRecords) -> Iterator[tuple[FakeKubelet, DevicePlugins]]:
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    broker = AllocationBroker(inventory(4, units_per_gpu=4), store, SharingConfig(shim_host_dir="/srv/shim"))
    config = PluginConfig(plugin_dir=str(plugin_dir), pod_resources_socket=None, poll_interval_s=0.05)
    plugins = start_device_plugins(broker, config)
    wait_until(lambda: len(kubelet.registered) == 2)
    yield kubelet, plugins
    plugins.stop()
    kubelet.stop()


def stub(plugin_dir: Path, resource: str) -> tuple[grpc.Channel, api_grpc.DevicePluginStub]:
    name = PluginConfig().socket_name(resource)
    channel = grpc.insecure_channel(f"unix://{plugin_dir / name}")
    return channel, api_grpc.DevicePluginStub(channel)


def test_each_resource_registers_with_version_endpoint_and_options(running, plugin_dir: Path) -> None:
    """Each resource registers with the API version, its own socket and the preferred-allocation option."""
    kubelet, _ = running
    by_resource = {r.resource_name: r for r in kubelet.registered}
    assert set(by_resource) == {WHOLE_GPU, SHARED_GPU}
    request = by_resource[WHOLE_GPU]
    assert request.version == "v1beta1"
    assert request.endpoint == "linkpack-nvidia.com_gpu.sock" and "/" not in request.endpoint
    assert (plugin_dir / request.endpoint).is_socket()
    assert request.options.get_preferred_allocation_available and not request.options.pre_start_required
    assert all(o.get_preferred_allocation_available and not o.pre_start_required for o in kubelet.options)


def test_list_and_watch_streams_devices_and_health_changes(running, plugin_dir: Path) -> None:
    """ListAndWatch sends the devices and then every health change."""
    _, plugins = running
    channel, client = stub(plugin_dir, SHARED_GPU)
    with channel:
        stream = client.ListAndWatch(api.Empty(), timeout=10)
        first = next(stream)
        assert len(first.devices) == 16 and all(d.health == "Healthy" for d in first.devices)
        first_id = first.devices[0].ID
        assert first_id == share_unit_id(uuid(0), 0)
        assert [n.ID for n in first.devices[0].topology.nodes] == [0]
        plugins.set_unhealthy({uuid(1)})
        second = next(stream)
        sick = sorted(d.ID for d in second.devices if d.health == "Unhealthy")
        assert sick == [share_unit_id(uuid(1), k) for k in range(4)]
        stream.cancel()


def test_preferred_allocation_and_allocate_follow_the_record(running, plugin_dir: Path, store) -> None:
    """GetPreferredAllocation and Allocate both follow the record, and the consumption is written back."""
    channel, client = stub(plugin_dir, WHOLE_GPU)
    with channel:
        preferred = client.GetPreferredAllocation(
            api.PreferredAllocationRequest(
                container_requests=[
                    api.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[uuid(3), uuid(0), uuid(2), uuid(1)], allocation_size=2
                    )
                ]
            ),
            timeout=5,
        )
        assert list(preferred.container_responses[0].deviceIDs) == [uuid(2), uuid(3)]
        answer = client.Allocate(
            api.AllocateRequest(
                container_requests=[api.ContainerAllocateRequest(devices_ids=[uuid(3), uuid(2)])]
            ),
            timeout=5,
        )
    (container,) = answer.container_responses
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuid(2)},{uuid(3)}"
    assert container.envs["LINKPACK_ENFORCEMENT"] == "none"
    assert "linkpack.io/consumed" in store.pod("uid-train").annotations


def test_a_share_gets_its_caps_and_the_shim_mount(running, plugin_dir: Path) -> None:
    """A cooperative share gets Linkpack's caps and the shim mount, without MPS variables."""
    channel, client = stub(plugin_dir, SHARED_GPU)
    with channel:
        answer = client.Allocate(
            api.AllocateRequest(
                container_requests=[api.ContainerAllocateRequest(devices_ids=[share_unit_id(uuid(1), 0)])]
            ),
            timeout=5,
        )
    container = answer.container_responses[0]
    assert container.envs["LINKPACK_ENFORCEMENT"] == "cooperative"
    assert container.envs["LINKPACK_MEMORY_LIMIT_MIB"] == "20480"
    assert container.envs["LINKPACK_MEMORY_FRACTION"] == "0.25"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in container.envs  # the record says cooperative
    assert [(m.container_path, m.host_path, m.read_only) for m in container.mounts] == [
        ("/opt/linkpack/shim", "/srv/shim", True)
    ]


def test_a_request_no_record_fits_is_refused_with_a_reason(running, plugin_dir: Path) -> None:
    """An Allocate no record fits is refused with FAILED_PRECONDITION and a reason."""
    channel, client = stub(plugin_dir, WHOLE_GPU)
    with channel, pytest.raises(grpc.RpcError) as refused:
        client.Allocate(
            api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=[uuid(0)])]),
            timeout=5,
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no Linkpack allocation record" in refused.value.details()


def test_pre_start_container_is_a_no_op(running, plugin_dir: Path) -> None:
    """PreStartContainer answers and does nothing."""
    channel, client = stub(plugin_dir, WHOLE_GPU)
    with channel:
        assert (
            client.PreStartContainer(api.PreStartContainerRequest(devices_ids=[uuid(0)]), timeout=5)
            is not None
        )


def test_a_kubelet_restart_makes_the_plugins_recreate_their_sockets_and_register_again(
    running, plugin_dir: Path
) -> None:
    """After a kubelet restart the plugins recreate their sockets and register again."""
    kubelet, plugins = running
    kubelet.restart()
    wait_until(lambda: len(kubelet.registered) == 4)
    assert {r.resource_name for r in kubelet.registered[2:]} == {WHOLE_GPU, SHARED_GPU}
    wait_until(
        lambda: all((plugin_dir / PluginConfig().socket_name(r)).is_socket() for r in plugins.resources)
    )
    channel, client = stub(plugin_dir, WHOLE_GPU)
    with channel:
        assert next(client.ListAndWatch(api.Empty(), timeout=5)).devices


def test_plugins_wait_for_the_kubelet_socket_to_appear(plugin_dir: Path, store) -> None:
    """The plugins serve at once and register as soon as the kubelet socket appears."""
    broker = AllocationBroker(inventory(2), store)
    config = PluginConfig(plugin_dir=str(plugin_dir), pod_resources_socket=None, poll_interval_s=0.05)
    plugins = start_device_plugins(broker, config)
    kubelet = FakeKubelet(plugin_dir)
    try:
        time.sleep(0.2)
        assert plugins.registrations == 0
        kubelet.start()
        wait_until(lambda: len(kubelet.registered) == 2)
    finally:
        plugins.stop()
        kubelet.stop()
    assert not any(plugin_dir.glob("linkpack-*.sock"))


def test_concurrent_allocates_over_grpc_hand_out_each_record_once(running, plugin_dir: Path, store) -> None:
    """Concurrent Allocate calls over gRPC hand out each record once."""
    for i in range(6):
        store.put(pod(f"one{i}", whole(i % 2), bound_at=10 + i))
    channel, client = stub(plugin_dir, WHOLE_GPU)
    outcomes: list[str] = []
    lock = threading.Lock()

    def ask() -> None:
        try:
            answer = client.Allocate(
                api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=[uuid(0)])]),
                timeout=5,
            )
            got = answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
        except grpc.RpcError as exc:
            got = exc.code().name
        with lock:
            outcomes.append(got)

    with channel:
        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(outcomes) == sorted([uuid(0), uuid(1)] + ["FAILED_PRECONDITION"] * 4)
