"""Linkpack's device plugin against the kubelet's own device manager (tests/kubelet/harness).

The harness serves Registration on /var/lib/kubelet/device-plugins/kubelet.sock, as a kubelet
does, so these tests need root and no kubelet running on the machine. Our plugin servers run in
this process on sockets in that directory; pods are admitted through the harness, which calls
GetPreferredAllocation and Allocate exactly as the kubelet does and hands back the run options
(env, mounts) the container would get.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contract.allocation import ComputePriority, Enforcement, decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from contract.pod_demand import ContainerDemand, ContainerRole
from node_agent.deviceplugin.broker import AllocationBroker
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.record_store import BoundPod, InMemoryPodRecords
from node_agent.deviceplugin.server import (
    DevicePlugins,
    KubeletPodResources,
    PluginConfig,
    start_device_plugins,
)
from tests.node.real_node import node_lock
from tests.support.device_plugin import (
    MIG_GPU,
    app,
    bound_pod,
    init,
    inventory,
    mig,
    mig_uuid,
    share,
    sidecar,
    uuid,
    whole,
)
from tests.support.resources import GPU, SHARED

from .harness_process import (
    CHECKPOINT,
    DEVICE_PLUGIN_DIR,
    KUBELET_SOCKET,
    HarnessUnavailable,
    KubeletHarness,
    harness_binary,
)

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(1800)]

UNITS = 4
MIG = MIG_GPU


@pytest.fixture(scope="module")
def binary() -> Path:
    if os.geteuid() != 0:
        pytest.skip("the kubelet's device manager listens on /var/lib/kubelet/device-plugins: needs root")
    if KUBELET_SOCKET.exists():
        pytest.skip(f"{KUBELET_SOCKET} exists: a kubelet (or another test) is running here")
    try:
        return harness_binary()
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))


@dataclass
class Node:
    kubelet: KubeletHarness
    plugins: DevicePlugins
    store: InMemoryPodRecords
    broker: AllocationBroker
    pod_resources: Path

    def admit(self, bound: BoundPod) -> dict[str, Any]:
        """Put the pod in the store (bound, with its record) unless it is there, and have the kubelet admit it."""
        if bound.ref.uid not in {p.ref.uid for p in self.store.list_bound_pods_on_node()}:
            self.store.put(bound)
        return self.kubelet.send("allocate", pod=pod_spec(bound))

    def capacity(self) -> dict[str, Any]:
        answer = self.kubelet.send("capacity")
        assert answer["ok"], answer
        return answer

    def wait_for(
        self, want: dict[str, int], field: str = "allocatable", timeout_s: float = 15.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.capacity()
            if all(answer[field].get(k) == v for k, v in want.items()):
                return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"kubelet {field} is {answer[field]}, wanted {want}")
            time.sleep(0.1)


def pod_spec(bound: BoundPod) -> dict[str, Any]:
    def entry(c: ContainerDemand) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": c.name, "limits": dict(c.amounts)}
        if c.role is ContainerRole.SIDECAR:
            spec["restartPolicy"] = "Always"
        return spec

    return {
        "namespace": bound.ref.namespace,
        "name": bound.ref.name,
        "uid": bound.ref.uid,
        "initContainers": [entry(c) for c in bound.containers if c.role is not ContainerRole.APP],
        "containers": [entry(c) for c in bound.containers if c.role is ContainerRole.APP],
    }


@pytest.fixture
def node(binary: Path, tmp_path: Path) -> Iterator[Node]:
    with node_lock():  # the device-plugin directory is the machine's one kubelet slot
        yield from _node(binary, tmp_path)


def _node(binary: Path, tmp_path: Path) -> Iterator[Node]:
    created = [p for p in (DEVICE_PLUGIN_DIR.parent, DEVICE_PLUGIN_DIR) if not p.exists()]
    short = Path(tempfile.mkdtemp(prefix="lp-kl-", dir="/tmp"))  # unix socket paths must stay short
    kubelet = KubeletHarness(binary, tmp_path / "harness.log")
    plugins = None
    try:
        started = kubelet.send("start")
        assert started["ok"], started
        pod_resources = short / "pod-resources.sock"
        assert kubelet.send("podresources", socket=str(pod_resources))["ok"]
        store = InMemoryPodRecords()
        broker = AllocationBroker(
            inventory(4, units_per_gpu=UNITS, mig_gpus=(3,)),
            store,
            SharingConfig(shim_host_dir="/srv/linkpack/shim"),
        )
        config = PluginConfig(
            plugin_dir=str(DEVICE_PLUGIN_DIR),
            pod_resources_socket=str(pod_resources),
            socket_prefix=f"lp-test-{os.getpid()}",
            poll_interval_s=0.1,
            reconcile_interval_s=3600,
        )
        plugins = start_device_plugins(broker, config)
        yield Node(kubelet, plugins, store, broker, pod_resources)
    finally:
        if plugins is not None:
            plugins.stop()
        kubelet.close()
        for leftover in (KUBELET_SOCKET, CHECKPOINT):
            leftover.unlink(missing_ok=True)
        for sock in DEVICE_PLUGIN_DIR.glob(f"lp-test-{os.getpid()}-*.sock"):
            sock.unlink(missing_ok=True)
        for directory in reversed(created):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty: never remove what was there before
        shutil.rmtree(short, ignore_errors=True)


FULL = {GPU: 3, SHARED: 3 * UNITS, MIG: 2}


def test_plugins_register_and_the_kubelet_sees_every_resource(node: Node) -> None:
    """The kubelet sees every resource the plugins register, with full capacity."""
    answer = node.wait_for(FULL, field="capacity")
    assert {k: answer["allocatable"][k] for k in FULL} == FULL
    assert answer["inactive"] == []


def test_preferred_allocation_is_asked_with_unsorted_ids_and_honoured(node: Node) -> None:
    """The kubelet asks for a preference with unsorted IDs and takes the record's devices."""
    node.wait_for(FULL)
    asked: list[tuple[str, list[str], int]] = []
    preferred = node.broker.preferred

    def recording(resource, available, must_include, size):
        asked.append((resource, list(available), size))
        return preferred(resource, available, must_include, size)

    node.broker.preferred = recording  # type: ignore[method-assign]
    answer = node.admit(bound_pod("train", whole(2, 0), bound_at=1))
    assert answer["ok"], answer
    ((resource, available, size),) = asked
    assert (resource, size) == (GPU, 2)
    assert sorted(available) == [uuid(0), uuid(1), uuid(2)]
    (container,) = answer["containers"]
    assert container["devices"] == {GPU: [uuid(0), uuid(2)]}  # the kubelet took our choice
    assert container["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{uuid(0)},{uuid(2)}"
    assert container["envs"]["LINKPACK_ENFORCEMENT"] == "none"
    assert container["mounts"] == []
    assert node.broker.counters.id_mismatches == 0


def test_a_share_container_gets_the_records_caps_and_the_shim(node: Node) -> None:
    """A cooperative share container gets the record's caps and the shim mount, and no MPS variables."""
    node.wait_for(FULL)
    answer = node.admit(bound_pod("infer", share(1, 20480, 2), bound_at=1))
    assert answer["ok"], answer
    (container,) = answer["containers"]
    assert [d.split("::")[0] for d in container["devices"][SHARED]] == [uuid(1)] * 2
    envs = container["envs"]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == uuid(1)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in envs  # the record says cooperative, not MPS
    assert (envs["LINKPACK_MEMORY_LIMIT_MIB"], envs["LINKPACK_MEMORY_FRACTION"]) == ("20480", "0.25")
    assert envs["LINKPACK_ENFORCEMENT"] == "cooperative"
    assert envs["PYTHONPATH"] == "/opt/linkpack/shim"
    assert container["mounts"] == [
        {"containerPath": "/opt/linkpack/shim", "hostPath": "/srv/linkpack/shim", "readOnly": True}
    ]


def test_mig_and_multi_container_pods_get_what_their_records_say(node: Node) -> None:
    """MIG and multi-container pods get exactly the devices their records say, as the kubelet accounts them."""
    node.wait_for(FULL)
    answer = node.admit(bound_pod("slice", mig(3, 1), bound_at=1))
    assert answer["ok"], answer
    assert answer["containers"][0]["envs"]["NVIDIA_VISIBLE_DEVICES"] == mig_uuid(3, 1)
    assert answer["containers"][0]["devices"] == {MIG: [mig_uuid(3, 1)]}

    containers = (init("prepare", GPU, 2), app("left", GPU, 1), app("right", GPU, 1))
    answer = node.admit(bound_pod("pair", whole(1, 2), containers, bound_at=2))
    assert answer["ok"], answer
    envs = {c["name"]: c["envs"]["NVIDIA_VISIBLE_DEVICES"] for c in answer["containers"]}
    kubelet = {c["name"]: ",".join(c["devices"][GPU]) for c in answer["containers"]}
    # the kubelet hands the init container's GPUs on in no set order; each app container gets
    # the one the kubelet accounts to it, and together they get exactly the record's two
    assert envs == kubelet
    assert envs["prepare"] == f"{uuid(1)},{uuid(2)}" and {envs["left"], envs["right"]} == {uuid(1), uuid(2)}
    assert node.broker.counters.id_mismatches == 0


def test_a_pod_without_a_record_is_refused_admission(node: Node) -> None:
    """A pod without a record is refused admission with the reason."""
    node.wait_for(FULL)
    stranger = BoundPod(bound_pod("x", None, (app("main", GPU, 1),)).ref, 0.0, (app("main", GPU, 1),))
    answer = node.admit(stranger)
    assert not answer["ok"] and "no Linkpack allocation record" in answer["error"]


def test_an_unhealthy_gpu_reduces_allocatable_and_recovers(node: Node) -> None:
    """An unhealthy GPU lowers allocatable (with its MIG instances) until it recovers."""
    node.wait_for(FULL)
    node.plugins.set_unhealthy({uuid(0), mig_uuid(3, 0)})
    answer = node.wait_for({GPU: 2, SHARED: 2 * UNITS, MIG: 1})
    assert {k: answer["capacity"][k] for k in FULL} == FULL  # capacity stays, allocatable drops
    node.plugins.set_unhealthy(())
    node.wait_for(FULL)


def test_after_a_kubelet_restart_the_plugins_register_again(node: Node) -> None:
    """After a kubelet restart the plugins register again and serve pods."""
    node.wait_for(FULL)
    before = node.plugins.registrations
    assert node.kubelet.send("restart")["ok"]  # a new manager: every socket removed, kubelet.sock recreated
    node.wait_for(FULL, timeout_s=30)
    assert node.plugins.registrations >= before + len(FULL)
    answer = node.admit(bound_pod("after", whole(1), bound_at=5))
    assert answer["ok"], answer
    assert answer["containers"][0]["envs"]["NVIDIA_VISIBLE_DEVICES"] == uuid(1)


def test_pods_admitted_out_of_bind_order_end_with_records_matching_their_gpus(node: Node) -> None:
    """Pods admitted out of bind order end with records matching the GPUs the kubelet gave them."""
    node.wait_for(FULL)
    first, second = bound_pod("first", whole(0), bound_at=1), bound_pod("second", whole(1), bound_at=2)
    node.store.put(first)
    # the kubelet admits the younger pod first: our guess (oldest bind) gives it first's GPU 0
    answer = node.admit(second)
    assert answer["ok"], answer
    assert answer["containers"][0]["envs"]["NVIDIA_VISIBLE_DEVICES"] == uuid(0)

    assignments = KubeletPodResources(str(node.pod_resources), node.broker.inventory.serves).list()
    assert [(a.pod, a.container, a.resource, a.device_ids) for a in assignments] == [
        ("second", "main", GPU, (uuid(0),))
    ]
    node.plugins.reconcile_now()  # the kubelet's account shows the swap; both records are rewritten
    assert node.broker.counters.swaps == 1

    answer = node.admit(first)
    assert answer["ok"], answer
    assert answer["containers"][0]["envs"]["NVIDIA_VISIBLE_DEVICES"] == uuid(1)
    for name, gpu in (("second", uuid(0)), ("first", uuid(1))):
        record = decode_allocation(node.store.pod(f"uid-{name}").annotations[ALLOCATION_ANNOTATION])
        assert record.gpu_uuids == (gpu,), name
    node.plugins.reconcile_now()
    assert node.broker.counters.swaps == 1 and node.broker.counters.unresolved == 0


def test_a_sidecar_keeps_its_gpu_beside_the_app_container(node: Node) -> None:
    """The kubelet gives a 1-GPU sidecar and a 1-GPU app container one GPU each, and so does the record."""
    node.wait_for(FULL)
    pair = bound_pod("pair", whole(0, 1), (sidecar("proxy", GPU, 1), app("main", GPU, 1)), bound_at=1)
    answer = node.admit(pair)
    assert answer["ok"], answer
    envs = {c["name"]: c["envs"]["NVIDIA_VISIBLE_DEVICES"] for c in answer["containers"]}
    kubelet = {c["name"]: ",".join(c["devices"][GPU]) for c in answer["containers"]}
    assert envs == kubelet and {envs["proxy"], envs["main"]} == {uuid(0), uuid(1)}
    assert node.broker.counters.id_mismatches == 0


def test_a_plain_init_container_after_a_sidecar_runs_beside_it(node: Node) -> None:
    """A 1-GPU sidecar before a 2-GPU init container takes 3 GPUs in the kubelet too, the init container none of the sidecar's."""
    node.wait_for(FULL)
    containers = (
        sidecar("proxy", GPU, 1),
        init("warm", GPU, 2),
        ContainerDemand("main", ContainerRole.APP, ()),
    )
    answer = node.admit(bound_pod("warmup", whole(0, 1, 2), containers, bound_at=1))
    assert answer["ok"], answer
    devices = {c["name"]: set(c["devices"].get(GPU, [])) for c in answer["containers"]}
    visible = {c["name"]: c["envs"].get("NVIDIA_VISIBLE_DEVICES", "") for c in answer["containers"]}
    assert visible["proxy"] == ",".join(sorted(devices["proxy"]))
    assert set(visible["warm"].split(",")) == devices["warm"]
    assert len(devices["warm"]) == 2 and not devices["warm"] & devices["proxy"]


@pytest.mark.timeout(120)
def test_an_interposer_share_container_gets_the_preload_and_its_mounts_through_the_kubelet(
    node: Node, tmp_path: Path
) -> None:
    """Through the kubelet's device manager an interposer share gets LD_PRELOAD, its caps and the library and state mounts, beside the shim."""
    node.wait_for(FULL)
    library_dir = tmp_path / "shim" / "interposer"
    library_dir.mkdir(parents=True)
    (library_dir / "liblinkpack_cuda.so").write_bytes(b"\x7fELF")  # the plugin checks it is there
    node.broker.sharing = SharingConfig(
        shim_host_dir="/srv/linkpack/shim",
        interposer_host_dir=str(library_dir),
        gpu_state_dir="/var/lib/linkpack/gpu-state",
    )
    held = bound_pod(
        "held",
        share(2, 4096, 1),
        bound_at=1,
        enforcement=Enforcement.INTERPOSER,
        priority=ComputePriority.LOW,
    )
    answer = node.admit(held)
    assert answer["ok"], answer
    (container,) = answer["containers"]
    envs = container["envs"]
    assert envs["LINKPACK_ENFORCEMENT"] == "interposer"
    assert envs["LD_PRELOAD"] == "/opt/linkpack/interposer/liblinkpack_cuda.so"
    assert (envs["LINKPACK_MEMORY_LIMIT_MIB"], envs["LINKPACK_COMPUTE_UNITS"]) == ("4096", "1")
    assert (envs["LINKPACK_UNITS_PER_GPU"], envs["LINKPACK_COMPUTE_PRIORITY"]) == (str(UNITS), "low")
    assert envs["LINKPACK_GPU_STATE_DIR"] == "/run/linkpack/gpu-state"
    assert sorted(container["mounts"], key=lambda m: m["containerPath"]) == [
        {"containerPath": "/opt/linkpack/interposer", "hostPath": str(library_dir), "readOnly": True},
        {"containerPath": "/opt/linkpack/shim", "hostPath": "/srv/linkpack/shim", "readOnly": True},
        {
            "containerPath": "/run/linkpack/gpu-state",
            "hostPath": "/var/lib/linkpack/gpu-state",
            "readOnly": False,
        },
    ]
