"""Process memory mapped to pods through cgroups, and pods above their share."""

from __future__ import annotations

import signal
from types import MappingProxyType

import pytest

from contract.allocation import Allocation, Enforcement, encode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from node_agent.kube.node_api import PodInfo
from node_agent.loop.watchdog import ProcessUse, Share, Watchdog, assess, pod_uid_from_cgroup, read_pod_uid
from node_agent.sources.nvml_simulated import SimulatedNvml
from tests.support.machines import catalog_machine
from tests.support.pods import pod_info
from topology.scheduling import GpuGrant

MIB = 1024 * 1024
UID_A = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
UID_B = "99999999-aaaa-4bbb-8ccc-dddddddddddd"


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver, burstable
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_4a7b_8c9d_0e1f2a3b4c5d.slice/"
        "cri-containerd-0123abcd.scope\n",
        # cgroup v2, systemd driver, guaranteed (no QoS level)
        "0::/kubepods.slice/kubepods-pod1b2c3d4e_5f60_4a7b_8c9d_0e1f2a3b4c5d.slice/cri-containerd-0123abcd.scope",
        # cgroup v1, cgroupfs driver, besteffort
        "12:memory:/kubepods/besteffort/pod1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d/0123abcd\n"
        "11:devices:/kubepods/besteffort/pod1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d/0123abcd\n",
        # cgroup v1, cgroupfs, guaranteed
        "4:cpu,cpuacct:/kubepods/pod1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d/0123abcd",
        # cgroup v1 systemd driver with docker, upper-case hex
        "9:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1B2C3D4E_5F60_4A7B_8C9D_0E1F2A3B4C5D.slice/"
        "docker-0123.scope",
    ],
)
def test_pod_uid_is_found_in_every_cgroup_layout(text):
    """The pod UID is found in every cgroup layout the kubelet creates."""
    assert pod_uid_from_cgroup(text) == UID_A


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/init.scope\n",
        "0::/system.slice/containerd.service",
        "12:memory:/user.slice/podman-1234.scope",
        "0::/kubepods.slice/kubepods-burstable.slice",
    ],
)
def test_processes_outside_pods_have_no_uid(text):
    """Processes outside pods have no pod UID."""
    assert pod_uid_from_cgroup(text) is None


def test_read_pod_uid_from_a_fake_proc_tree(tmp_path):
    """A PID's pod is read from its /proc cgroup file, and a vanished PID has none."""
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID_A}/abc\n")
    assert read_pod_uid(42, tmp_path) == UID_A
    assert read_pod_uid(43, tmp_path) is None  # process gone


def test_assess_flags_only_pods_above_their_share():
    """Only pods above their memory share are flagged, with their processes."""
    shares = [Share(UID_A, "ml", "train", 0, 1024 * MIB), Share(UID_B, "ml", "whole", 1, None)]
    procs = [
        ProcessUse(0, 10, 800 * MIB, UID_A),
        ProcessUse(0, 11, 300 * MIB, UID_A),
        ProcessUse(1, 12, 70_000 * MIB, UID_B),
        ProcessUse(0, 13, 5000 * MIB, None),  # host process
    ]
    report = assess(procs, shares)
    assert [(u.pod, u.gpu_index, u.used_bytes // MIB, u.allocated_bytes // MIB) for u in report.usage] == [
        ("train", 0, 1100, 1024),
        ("whole", 1, 70_000, 0),
    ]
    assert [(v.pod, v.pids) for v in report.violations] == [("train", (10, 11))]
    assert "1100 MiB on GPU 0, above its share of 1024 MiB" in report.violations[0].message
    assert assess(procs, shares, tolerance_bytes=100 * MIB).violations == ()


def _pod(uid: str, name: str, grants: tuple[GpuGrant, ...], node: str = "n1") -> PodInfo:
    return pod_info(
        name, uid=uid, node=node, resource_version="7", record=Allocation(node=node, grants=grants)
    )


def _proc_tree(tmp_path, pids: dict[int, str]):
    for pid, uid in pids.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/x.scope\n"
        )
    return tmp_path


def test_watchdog_reports_each_episode_once_and_can_kill(tmp_path):
    """Each episode over the share is reported once, and its processes can be killed."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    sim.set_process(2, 500, 3000 * MIB)
    sim.set_process(3, 501, 10 * MIB)
    proc = _proc_tree(tmp_path, {500: UID_A, 501: UID_B})
    pods = [
        _pod(UID_A, "small", (GpuGrant(2, "GPU-x", False, memory_mib=2048, units=10),)),
        _pod(UID_B, "fits", (GpuGrant(3, "GPU-y", False, memory_mib=2048, units=10),)),
    ]
    killed: list[tuple[int, int]] = []
    dog = Watchdog(
        sim, "n1", proc_root=proc, kill=True, kill_process=lambda pid, sig: killed.append((pid, sig))
    )
    first = dog.check(pods)
    assert [v.pod for v in first.violations] == ["small"] and [v.pod for v in first.new_violations] == [
        "small"
    ]
    assert killed == [(500, signal.SIGKILL)] and first.killed == (500,)
    second = dog.check(pods)
    assert second.violations and second.new_violations == ()  # same episode: no second event
    sim.remove_process(2, 500)
    assert dog.check(pods).violations == ()
    sim.set_process(2, 500, 3000 * MIB)
    assert [v.pod for v in dog.check(pods).new_violations] == ["small"]  # a new episode


def test_watchdog_without_kill_only_reports(tmp_path):
    """Without kill the watchdog only reports."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    sim.set_process(0, 600, 9000 * MIB)
    pods = [_pod(UID_A, "p", (GpuGrant(0, "GPU-x", False, memory_mib=1024),))]
    calls: list[int] = []
    dog = Watchdog(
        sim, "n1", proc_root=_proc_tree(tmp_path, {600: UID_A}), kill_process=lambda p, s: calls.append(p)
    )
    assert dog.check(pods).violations and calls == []


def test_whole_gpus_mig_and_foreign_allocations_are_not_policed(tmp_path):
    """Whole GPUs, MIG instances and allocations for other nodes are not policed."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    sim.set_process(0, 700, 80_000 * MIB)
    pods = [
        _pod(UID_A, "whole", (GpuGrant(0, "GPU-x", True),)),
        _pod(UID_B, "elsewhere", (GpuGrant(0, "GPU-x", False, memory_mib=1),), node="other-node"),
        PodInfo("ml", "broken", "u3", annotations=MappingProxyType({ALLOCATION_ANNOTATION: "{not json"})),
    ]
    report = Watchdog(sim, "n1", proc_root=_proc_tree(tmp_path, {700: UID_A})).check(pods)
    assert report.violations == ()
    assert any("allocation is for node other-node" in w for w in report.warnings)
    assert any("ml/broken: unreadable allocation" in w for w in report.warnings)


def test_unkillable_process_is_a_warning(tmp_path):
    """A process that cannot be killed is a warning, not a failure."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    sim.set_process(0, 800, 9000 * MIB)
    pods = [_pod(UID_A, "p", (GpuGrant(0, "GPU-x", False, memory_mib=1024),))]

    def refuse(pid: int, sig: int) -> None:
        raise ProcessLookupError(3, "No such process")

    dog = Watchdog(sim, "n1", proc_root=_proc_tree(tmp_path, {800: UID_A}), kill=True, kill_process=refuse)
    report = dog.check(pods)
    assert report.killed == () and any("could not kill process 800" in w for w in report.warnings)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("level", "meaning"),
    [
        (Enforcement.COOPERATIVE, "expected at this level"),
        (Enforcement.INTERPOSER, "the CUDA interposer should have refused this"),
        (Enforcement.HARD_MPS, "MPS should have refused this"),
    ],
)
def test_every_level_is_policed_at_the_records_cap_and_the_violation_names_the_level(
    tmp_path, level: Enforcement, meaning: str
) -> None:
    """Whatever the record's enforcement level, the watchdog polices the record's memory cap and its violation says the level and what an overrun means there."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    sim.set_process(4, 800, 2100 * MIB)
    grants = (GpuGrant(4, "GPU-x", False, memory_mib=2048, units=10),)
    allocation = Allocation(node="n1", grants=grants, enforcement=level)
    pods = [
        PodInfo(
            "ml", "held", UID_A, "7", "n1", "Running",
            MappingProxyType({ALLOCATION_ANNOTATION: encode_allocation(allocation)}),
        )
    ]  # fmt: skip
    report = Watchdog(sim, "n1", proc_root=_proc_tree(tmp_path, {800: UID_A})).check(pods)
    (violation,) = report.violations
    assert violation.limit_bytes == 2048 * MIB and violation.enforcement == level.value
    assert f"its record's enforcement is {level.value}" in violation.message and meaning in violation.message
    assert [(u.allocated_bytes, u.used_bytes) for u in report.usage] == [(2048 * MIB, 2100 * MIB)]
