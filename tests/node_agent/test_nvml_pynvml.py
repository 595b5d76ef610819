"""The pynvml adapter against a fake `pynvml` module: translation, binding quirks, no leaks."""

from __future__ import annotations

import contextlib
import ctypes
import sys

import pytest

from node_agent.sources.nvml_pynvml import PynvmlReader
from node_agent.sources.nvml_reader import (
    EventKind,
    NvmlError,
    NvmlReadError,
    NvmlUnavailable,
    P2PCapability,
    P2PStatus,
    RemoteDeviceType,
    XidEvent,
    cpulist_from_mask_words,
    lowest_set_bit,
    normalize_bus_id,
)
from tests.node_agent.fake_pynvml import (
    GPU_IS_LOST,
    LIBRARY_NOT_FOUND,
    NOT_SUPPORTED,
    UNKNOWN,
    FakeGpu,
    FakeMig,
    FakePynvml,
)
from topology.model import LinkKind, MigMode

GIB = 1024**3
BUS0, BUS1 = "00000000:07:00.0", "00000000:0F:00.0"


def _fake() -> FakePynvml:
    g0 = FakeGpu(
        "GPU-aaaaaaaa-0000-0000-0000-000000000000",
        bus=BUS0,
        links={0: (1, 4, BUS1, 0), 1: (1, 4, BUS1, 0), 2: (0, 4, "", 0)},
        procs=[(101, 2 * GIB), (102, None)],
        ecc={(1, 0): 2},
        remapped=(0, 1, 1, 0),
    )
    g1 = FakeGpu(
        "GPU-bbbbbbbb-0000-0000-0000-000000000000",
        bus=BUS1,
        cpu_words=(0, 0b11),  # CPUs 64-65
        node_words=None,
        links={i: (1, 6, "0000000A:00:00.0", 2) for i in range(18)},
        mig_mode=(1, 1),
        migs=[
            FakeMig("MIG-1", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * GIB, 1, 0, 3),
            None,
            FakeMig("MIG-2", "odd name", 10 * GIB, 2, 0, 1),
        ],
    )
    return FakePynvml([g0, g1])


@pytest.fixture
def fake() -> FakePynvml:
    return _fake()


@pytest.fixture
def reader(fake, tmp_path) -> PynvmlReader:
    return PynvmlReader.open(fake, cpu_count=128, sysfs_root=tmp_path)


def test_mask_and_bus_id_helpers():
    """CPU masks become cpulists, NUMA masks their lowest bit, and bus ids compare in one spelling."""
    assert cpulist_from_mask_words([0b1101_0000_1111, 1 << 63, 1]) == "0-3,8,10-11,127-128"
    assert cpulist_from_mask_words([0, 0]) == ""
    assert lowest_set_bit([0, 0b1000]) == 67 and lowest_set_bit([0]) is None
    assert normalize_bus_id("0000:0f:00.0") == "00000000:0F:00.0" == normalize_bus_id("00000000:0F:00.0")


def test_identity_and_affinity_are_translated(reader):
    """Identity and affinity come back in our types, with bytes and cpulists as NVML reports them."""
    d = reader.identity(0)
    assert (d.uuid, d.name, d.pci_bus_id) == (
        "GPU-aaaaaaaa-0000-0000-0000-000000000000",
        "NVIDIA A100-SXM4-80GB",
        BUS0,
    )
    assert d.memory_total_mib == 80 * 1024 and d.memory_used_bytes == GIB
    a0 = reader.affinity(0)
    assert (a0.cpulist, a0.numa_node, a0.gpu_numa_id) == ("0-7", 2, None)
    a1 = reader.affinity(1)
    assert a1.cpulist == "64-65" and a1.numa_node is None  # no memory affinity, no sysfs file


def test_numa_falls_back_to_sysfs(fake, tmp_path):
    """Without NVML's NUMA answer, the node is read from sysfs."""
    node_dir = tmp_path / "bus" / "pci" / "devices" / "0000:0f:00.0"
    node_dir.mkdir(parents=True)
    (node_dir / "numa_node").write_text("1\n")
    reader = PynvmlReader.open(fake, cpu_count=128, sysfs_root=tmp_path)
    assert reader.affinity(1).numa_node == 1


def test_p2p_read_is_asked_with_the_integer_zero(reader, fake):
    """The P2P read capability is asked as the integer zero, and status codes map to our enum."""
    fake.p2p[(0, 1, 0)] = 3
    assert reader.p2p_status(0, 1, P2PCapability.READ) is P2PStatus.TOPOLOGY_NOT_SUPPORTED
    assert reader.p2p_status(0, 1, P2PCapability.NVLINK) is P2PStatus.OK
    fake.p2p[(0, 1, 4)] = 42
    assert reader.p2p_status(0, 1, P2PCapability.PCI) is P2PStatus.UNKNOWN
    # the module's own constant would break the call; the adapter never uses it
    with pytest.raises(ctypes.ArgumentError):
        fake.nvmlDeviceGetP2PStatus(None, None, fake.NVML_P2P_CAPS_INDEX_READ)


def test_topology_levels_map_to_link_kinds(reader, fake):
    """NVML topology levels map to our link kinds, unknown levels to SYS."""
    for level, kind in [(0, LinkKind.INTERNAL), (10, LinkKind.PIX), (20, LinkKind.PXB), (30, LinkKind.PHB),
                        (40, LinkKind.NODE), (50, LinkKind.SYS), (77, LinkKind.SYS)]:  # fmt: skip
        fake.levels[(0, 1)] = level
        assert reader.topology_level(0, 1) is kind


def test_nvlinks_are_probed_up_to_the_binding_maximum(reader, fake):
    """NVLinks are probed up to the binding's maximum, with their state and far end."""
    links = reader.nvlinks(0)
    assert [(lk.link, lk.active, lk.remote_pci_bus_id) for lk in links] == [
        (0, True, BUS1),
        (1, True, BUS1),
        (2, False, ""),
    ]
    assert links[0].remote_type is RemoteDeviceType.GPU and links[0].generation == 3
    assert fake.calls.count("nvmlDeviceGetNvLinkState") == 36
    switch_links = reader.nvlinks(1)
    assert len(switch_links) == 18 and {lk.remote_type for lk in switch_links} == {RemoteDeviceType.SWITCH}
    assert switch_links[0].generation == 4


def test_an_older_binding_without_a_function_is_unsupported_not_a_crash(reader, monkeypatch):
    """A function missing from an older binding reads as unsupported, not a crash."""
    monkeypatch.delattr(FakePynvml, "nvmlDeviceGetNumaNodeId")
    monkeypatch.delattr(FakePynvml, "nvmlDeviceGetNvLinkRemoteDeviceType")
    assert reader.affinity(0).gpu_numa_id is None
    assert {lk.remote_type for lk in reader.nvlinks(0)} == {RemoteDeviceType.UNKNOWN}
    monkeypatch.delattr(FakePynvml, "nvmlDeviceGetUUID")
    with pytest.raises(NvmlReadError, match="nvmlDeviceGetUUID"):
        reader.identity(0)


def test_nvlink_remote_type_unsupported_is_unknown(reader, fake):
    """An unsupported NVLink remote type reads as unknown."""
    fake.fail["nvmlDeviceGetNvLinkRemoteDeviceType"] = NOT_SUPPORTED
    assert {lk.remote_type for lk in reader.nvlinks(0)} == {RemoteDeviceType.UNKNOWN}


def test_a_lost_gpu_during_link_probing_is_an_error(reader, fake):
    """A GPU lost while its links are probed is an NvmlReadError saying so."""
    fake.fail["nvmlDeviceGetNvLinkState"] = GPU_IS_LOST
    with pytest.raises(NvmlReadError) as err:
        reader.nvlinks(0)
    assert err.value.gpu_lost


def test_mig_devices_skip_empty_slots_and_read_profiles(reader):
    """MIG instances skip empty slots and carry their profiles."""
    assert reader.mig(0).mode is MigMode.DISABLED
    mig = reader.mig(1)
    assert mig.mode is MigMode.ENABLED
    assert [(d.uuid, d.profile, d.gpu_instance_id, d.memory_mib) for d in mig.devices] == [
        ("MIG-1", "3g.40gb", 1, 40 * 1024),
        ("MIG-2", "1g.10gb", 2, 10 * 1024),  # profile rebuilt from slices and memory
    ]


def test_mig_unsupported(reader, fake):
    """A GPU without MIG reads as MIG unsupported."""
    fake.gpus[0].mig_mode = None
    assert reader.mig(0).mode is MigMode.UNSUPPORTED


def test_processes_utilization_and_ecc(reader, fake):
    """Processes, utilization and ECC counters come back in our types."""
    assert [(p.pid, p.used_memory_bytes) for p in reader.processes(0)] == [(101, 2 * GIB), (102, None)]
    u = reader.utilization(0)
    assert u is not None and (u.gpu_percent, u.memory_percent) == (37, 12)
    ecc = reader.ecc(0)
    assert (ecc.volatile_uncorrected, ecc.volatile_corrected, ecc.remap_pending, ecc.remap_failed) == (
        2,
        0,
        True,
        False,
    )
    fake.fail["nvmlDeviceGetUtilizationRates"] = NOT_SUPPORTED
    fake.fail["nvmlDeviceGetTotalEccErrors"] = NOT_SUPPORTED
    fake.fail["nvmlDeviceGetRemappedRows"] = NOT_SUPPORTED
    assert reader.utilization(0) is None
    assert not reader.ecc(0).supported


def test_events_are_subscribed_and_translated(reader, fake):
    """XID and ECC events are subscribed on every GPU and translated."""
    assert fake.registered == [(0, 0x8 | 0x2), (1, 0x8 | 0x2)]
    assert reader.wait_event(10) is None  # NVML timeout
    fake.queue_event(1, 0x8, 79)
    fake.queue_event(0, 0x2)
    assert reader.wait_event(10) == XidEvent(1, EventKind.XID, 79)
    assert reader.wait_event(10) == XidEvent(0, EventKind.DOUBLE_BIT_ECC, 0)
    fake.fail["nvmlEventSetWait"] = UNKNOWN
    with pytest.raises(NvmlReadError, match="nvmlEventSetWait"):
        reader.wait_event(10)


def test_open_failures_become_unavailable(fake):
    """A library that cannot be initialised is NvmlUnavailable."""
    fake.fail["nvmlInit"] = LIBRARY_NOT_FOUND
    with pytest.raises(NvmlUnavailable, match="nvmlInit failed: fake NVML error 12"):
        PynvmlReader.open(fake)
    fake.fail.clear()
    fake.fail["nvmlDeviceGetHandleByIndex"] = GPU_IS_LOST
    with pytest.raises(NvmlUnavailable, match="cannot enumerate GPUs"):
        PynvmlReader.open(fake)
    assert fake.shutdowns == 1


def test_default_module_is_imported_by_name(fake, monkeypatch):
    """By default the `pynvml` module is imported by name."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = PynvmlReader.open(cpu_count=8)
    assert reader.device_count() == 2 and reader.driver_version() == "550.54.15"


def test_close_frees_events_and_shuts_down_once(reader, fake):
    """Closing frees the event set and shuts NVML down once, however often it is called."""
    reader.close()
    reader.close()
    assert (fake.freed, fake.shutdowns) == (1, 1)
    with pytest.raises(NvmlReadError, match="closed"):
        reader.identity(0)


def test_events_unsupported_leave_gpus_unwatched(fake):
    """GPUs that cannot report events are listed as unwatched."""
    fake.fail["nvmlDeviceRegisterEvents"] = NOT_SUPPORTED
    reader = PynvmlReader.open(fake)
    assert reader.unwatched == (0, 1)


_CALLS = [
    ("identity", (0,)),
    ("affinity", (1,)),
    ("topology_level", (0, 1)),
    ("p2p_status", (0, 1, P2PCapability.READ)),
    ("nvlinks", (0,)),
    ("mig", (1,)),
    ("processes", (0,)),
    ("utilization", (0,)),
    ("ecc", (0,)),
    ("wait_event", (5,)),
    ("driver_version", ()),
    ("identity", (7,)),  # out of range
]
_FAILURES = [UNKNOWN, GPU_IS_LOST, NOT_SUPPORTED, 2, ctypes.ArgumentError("bad"), RuntimeError("binding bug")]


@pytest.mark.parametrize("failure", _FAILURES, ids=repr)
@pytest.mark.parametrize(("method", "args"), _CALLS, ids=lambda v: v if isinstance(v, str) else "")
def test_no_nvml_error_leaks(failure, method, args):
    """No NVML exception escapes the reader: every failure is our own error type."""
    fake = _fake()
    reader = PynvmlReader.open(fake, cpu_count=64)
    fake.queue_event(0, 0x8, 13)
    for name in dir(fake):
        if name.startswith("nvml") and name not in ("nvmlShutdown",):
            fake.fail[name] = failure
    with contextlib.suppress(NvmlError):
        getattr(reader, method)(*args)
    reader.close()
