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

from contract.allocation import ComputePriority, Enforcement
from node_agent.deviceplugin._generated import deviceplugin_pb2 as api  # the kubelet's messages
from node_agent.deviceplugin._generated import deviceplugin_pb2_grpc as api_grpc
from node_agent.deviceplugin.broker import AllocationBroker
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.inventory import share_unit_id
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from node_agent.deviceplugin.server import DevicePlugins, PluginConfig, start_device_plugins
from tests.support.device_plugin import MIG_GPU, bound_pod, inventory, mig, mig_uuid, share, uuid, whole
from tests.support.resources import GPU, SHARED

from .fake_kubelet import FakeKubelet, wait_until

pytestmark = pytest.mark.timeout(60)

INTERPOSER = Enforcement.INTERPOSER


@pytest.fixture
def store() -> InMemoryPodRecords:
    return InMemoryPodRecords(
        [bound_pod("train", whole(2, 3), bound_at=1), bound_pod("infer", share(1, 20480, 1), bound_at=2)]
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
    assert set(by_resource) == {GPU, SHARED}
    request = by_resource[GPU]
    assert request.version == "v1beta1"
    assert request.endpoint == "linkpack-nvidia.com_gpu.sock" and "/" not in request.endpoint
    assert (plugin_dir / request.endpoint).is_socket()
    assert request.options.get_preferred_allocation_available and not request.options.pre_start_required
    assert all(o.get_preferred_allocation_available and not o.pre_start_required for o in kubelet.options)


def test_list_and_watch_streams_devices_and_health_changes(running, plugin_dir: Path) -> None:
    """ListAndWatch sends the devices and then every health change."""
    _, plugins = running
    channel, client = stub(plugin_dir, SHARED)
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
    channel, client = stub(plugin_dir, GPU)
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
    channel, client = stub(plugin_dir, SHARED)
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
    channel, client = stub(plugin_dir, GPU)
    with channel, pytest.raises(grpc.RpcError) as refused:
        client.Allocate(
            api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=[uuid(0)])]),
            timeout=5,
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no Linkpack allocation record" in refused.value.details()


def test_pre_start_container_is_a_no_op(running, plugin_dir: Path) -> None:
    """PreStartContainer answers and does nothing."""
    channel, client = stub(plugin_dir, GPU)
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
    assert {r.resource_name for r in kubelet.registered[2:]} == {GPU, SHARED}
    wait_until(
        lambda: all((plugin_dir / PluginConfig().socket_name(r)).is_socket() for r in plugins.resources)
    )
    channel, client = stub(plugin_dir, GPU)
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
        store.put(bound_pod(f"one{i}", whole(i % 2), bound_at=10 + i))
    channel, client = stub(plugin_dir, GPU)
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


# ------------------------------------------------------------------------------------------------
# enforcement levels over the wire


@pytest.fixture
def levels(plugin_dir: Path, tmp_path: Path) -> Iterator[tuple[DevicePlugins, SharingConfig]]:
    """Plugins on a node offering every level, with one pod per level: an interposer share, a
    hard-MPS share, a whole-GPU pair and a MIG slice."""
    interposer = tmp_path / "shim" / "interposer"
    interposer.mkdir(parents=True)
    (interposer / "liblinkpack_cuda.so").write_bytes(b"\x7fELF")  # only its presence is checked here
    sharing = SharingConfig(
        shim_host_dir=str(tmp_path / "shim"),
        interposer_host_dir=str(interposer),
        gpu_state_dir=str(tmp_path / "gpu-state"),
        mps_pipe_dir=str(tmp_path / "mps-pipe"),
    )
    store = InMemoryPodRecords(
        [
            bound_pod(
                "held", share(1, 2048, 3), bound_at=1, enforcement=INTERPOSER, priority=ComputePriority.LOW
            ),
            bound_pod("mps", share(2, 4096, 2), bound_at=2, enforcement=Enforcement.HARD_MPS),
            bound_pod("pair", whole(0, 1), bound_at=3),
            bound_pod("slice", mig(3, 0), bound_at=4),
        ]
    )
    inv = inventory(4, units_per_gpu=4, mig_gpus=(3,))
    broker = AllocationBroker(inv, store, sharing, mps_ready=lambda: True)
    config = PluginConfig(plugin_dir=str(plugin_dir), pod_resources_socket=None, poll_interval_s=0.05)
    plugins = start_device_plugins(broker, config)
    yield plugins, sharing
    plugins.stop()


def allocate(plugin_dir: Path, resource: str, ids: list[str]) -> api.ContainerAllocateResponse:
    channel, client = stub(plugin_dir, resource)
    with channel:
        answer = client.Allocate(
            api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=ids)]), timeout=5
        )
    return answer.container_responses[0]


def mounts_of(container: api.ContainerAllocateResponse) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in container.mounts}


@pytest.mark.timeout(30)
def test_an_interposer_share_is_answered_with_the_preload_its_mount_and_its_caps(
    levels, plugin_dir: Path
) -> None:
    """Allocate over gRPC answers an interposer share with LD_PRELOAD, the library's read-only mount, its caps, its priority and the shared state directory."""
    _, sharing = levels
    container = allocate(plugin_dir, SHARED, [share_unit_id(uuid(1), k) for k in range(3)])
    envs = dict(container.envs)
    assert envs["LINKPACK_ENFORCEMENT"] == "interposer" and "LINKPACK_ENFORCEMENT_FALLBACK" not in envs
    assert envs["LD_PRELOAD"] == "/opt/linkpack/interposer/liblinkpack_cuda.so"
    assert envs["LINKPACK_MEMORY_LIMIT_MIB"] == "2048" and envs["LINKPACK_MEMORY_FRACTION"] == "0.025"
    assert (envs["LINKPACK_COMPUTE_UNITS"], envs["LINKPACK_UNITS_PER_GPU"]) == ("3", "4")
    assert envs["LINKPACK_COMPUTE_PRIORITY"] == "low"
    assert envs["LINKPACK_GPU_STATE_DIR"] == "/run/linkpack/gpu-state"
    assert envs["PYTHONPATH"] == "/opt/linkpack/shim"
    assert mounts_of(container) == {
        "/opt/linkpack/shim": (sharing.shim_host_dir, True),
        "/opt/linkpack/interposer": (sharing.interposer_host_dir, True),
        "/run/linkpack/gpu-state": (sharing.gpu_state_dir, False),
    }
    assert not any(name.startswith("CUDA_MPS_") for name in envs)


@pytest.mark.timeout(30)
def test_an_mps_share_is_answered_with_its_client_limits_and_no_preload(levels, plugin_dir: Path) -> None:
    """Allocate over gRPC answers a hard-MPS share with its pinned memory, thread percentage and pipe directory, and no LD_PRELOAD."""
    _, sharing = levels
    container = allocate(plugin_dir, SHARED, [share_unit_id(uuid(2), k) for k in range(2)])
    envs = dict(container.envs)
    assert envs["LINKPACK_ENFORCEMENT"] == "hard-mps"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == sharing.mps_pipe_dir
    assert "LD_PRELOAD" not in envs and "CUDA_MPS_CLIENT_PRIORITY" not in envs
    assert mounts_of(container)[str(sharing.mps_pipe_dir)] == (sharing.mps_pipe_dir, False)


@pytest.mark.timeout(30)
def test_whole_gpu_and_mig_containers_get_no_preload_no_mps_and_no_mounts(levels, plugin_dir: Path) -> None:
    """Allocate over gRPC answers whole-GPU and MIG containers with their devices only: no LD_PRELOAD, no MPS variable, no cap, no mount."""
    for resource, ids in ((GPU, [uuid(0), uuid(1)]), (MIG_GPU, [mig_uuid(3, 0)])):
        container = allocate(plugin_dir, resource, ids)
        envs = dict(container.envs)
        assert set(envs) == {"NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LINKPACK_ENFORCEMENT"}, resource
        assert envs["LINKPACK_ENFORCEMENT"] in ("none", "mig")
        assert list(container.mounts) == []


@pytest.mark.timeout(30)
def test_an_interposer_share_on_a_node_that_lost_the_library_falls_back_and_is_counted(
    levels, plugin_dir: Path
) -> None:
    """When the installed library has gone, an interposer share is answered cooperatively, says why, and is counted as a fallback."""
    plugins, sharing = levels
    assert sharing.interposer_host_dir is not None
    (Path(sharing.interposer_host_dir) / "liblinkpack_cuda.so").unlink()
    container = allocate(plugin_dir, SHARED, [share_unit_id(uuid(1), k) for k in range(3)])
    envs = dict(container.envs)
    assert envs["LINKPACK_ENFORCEMENT"] == "cooperative"
    assert "interposer library is not installed" in envs["LINKPACK_ENFORCEMENT_FALLBACK"]
    assert "LD_PRELOAD" not in envs and "/opt/linkpack/interposer" not in mounts_of(container)
    counters = plugins.broker.counters
    assert counters.enforcement_disagreements == 1 and counters.fallbacks == {"interposer": 1}
    assert counters.applied == {"cooperative": 1}
