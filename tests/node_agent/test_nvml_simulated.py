"""The simulated NVML answers like the real machines it was built from."""

from __future__ import annotations

from collections import Counter

import pytest

from node_agent.sources.nvml_reader import (
    EventKind,
    NvmlReadError,
    P2PCapability,
    P2PStatus,
    RemoteDeviceType,
    XidEvent,
)
from node_agent.sources.nvml_simulated import FaultCommandError, SimulatedNvml
from tests.support.machines import catalog_machine
from topology.model import LinkKind, MigDevice, MigMode

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("name", "links", "version", "switches"), [("dgx-a100", 12, 4, 6), ("hgx-h100", 18, 6, 4)]
)
def test_nvswitch_machines_report_every_link_ending_at_a_switch(name, links, version, switches):
    """On NVSwitch machines every NVLink of a GPU ends at a switch."""
    sim = SimulatedNvml(catalog_machine(name))
    assert sim.device_count() == 8
    for i in range(8):
        nvlinks = sim.nvlinks(i)
        assert len(nvlinks) == links
        assert all(lk.active and lk.remote_type is RemoteDeviceType.SWITCH for lk in nvlinks)
        assert {lk.version for lk in nvlinks} == {version}
        assert len({lk.remote_pci_bus_id for lk in nvlinks}) == switches
        assert all(sim.p2p_status(i, j, P2PCapability.NVLINK) is P2PStatus.OK for j in range(8) if j != i)


def test_dgx1_v100_cube_mesh_counts_links_to_each_peer():
    """On the DGX-1 cube mesh each peer is reached over as many links as `NV<k>` says."""
    sim = SimulatedNvml(catalog_machine("dgx1-v100"))
    bus = {sim.identity(i).pci_bus_id: i for i in range(8)}
    per_peer = Counter(bus[lk.remote_pci_bus_id] for lk in sim.nvlinks(0))
    assert per_peer == {1: 2, 2: 2, 3: 1, 4: 1}  # NV2 NV2 NV1 NV1 in the capture
    for i in range(8):
        links = sim.nvlinks(i)
        assert len(links) == 6  # every V100 SXM2 uses all six links in a DGX-1
        assert all(lk.remote_type is RemoteDeviceType.GPU and lk.version == 2 for lk in links)
    assert sim.p2p_status(0, 5, P2PCapability.NVLINK) is P2PStatus.NOT_SUPPORTED
    assert sim.p2p_status(0, 5, P2PCapability.READ) is P2PStatus.OK
    assert sim.topology_level(0, 5) is LinkKind.NODE


def test_nvlink_pairs_report_their_pcie_path_from_numa():
    """NVLink pairs report the PCIe path their NUMA placement implies."""
    sim = SimulatedNvml(catalog_machine("dgx-a100"))  # GPU0/1 on NUMA 3, GPU2 on NUMA 1
    assert sim.topology_level(0, 1) is LinkKind.NODE
    assert sim.topology_level(0, 2) is LinkKind.SYS
    assert sim.affinity(0).cpulist == "48-63,176-191"
    assert sim.affinity(0).numa_node == 3


def test_identity_is_deterministic_and_unique():
    """Simulated UUIDs are the same for one node name and differ between nodes."""
    a = SimulatedNvml(catalog_machine("hgx-h100"), node_name="node-a")
    b = SimulatedNvml(catalog_machine("hgx-h100"), node_name="node-a")
    c = SimulatedNvml(catalog_machine("hgx-h100"), node_name="node-c")
    ids_a = [a.identity(i) for i in range(8)]
    assert ids_a == [b.identity(i) for i in range(8)]
    assert len({d.uuid for d in ids_a}) == 8
    assert len({d.pci_bus_id for d in ids_a}) == 8
    assert {d.uuid for d in ids_a}.isdisjoint(c.identity(i).uuid for i in range(8))
    assert ids_a[0].name == "H100 80GB HBM3"
    assert ids_a[0].memory_total_mib == 81559
    assert all(d.uuid.startswith("GPU-") for d in ids_a)


def test_without_a_node_name_the_catalog_uuids_are_kept_and_from_machine_works():
    """Without a node name the catalog's UUIDs are kept, and machines load by name."""
    topo = catalog_machine("dgx-a100")
    sim = SimulatedNvml.from_machine("dgx-a100")
    assert [sim.identity(i).uuid for i in range(8)] == [g.uuid for g in topo.gpus]
    assert [sim.identity(i).pci_bus_id for i in range(8)] == [g.pci_bus_id for g in topo.gpus]


def test_injected_xid_is_delivered_once_and_79_makes_the_gpu_unreadable():
    """An injected XID is delivered once, and XID 79 also makes the GPU unreadable."""
    sim = SimulatedNvml(catalog_machine("dgx-a100"))
    assert sim.wait_event(0) is None
    sim.inject_xid(3, 79)
    assert sim.wait_event(10) == XidEvent(3, EventKind.XID, 79)
    assert sim.wait_event(0) is None
    with pytest.raises(NvmlReadError) as err:
        sim.identity(3)
    assert err.value.gpu_lost
    sim.identity(2)  # the others stay readable
    sim.clear_faults(3)
    assert sim.identity(3).index == 3


def test_ecc_nvlink_and_process_faults():
    """ECC counters, NVLink state and processes can be set and cleared."""
    sim = SimulatedNvml(catalog_machine("dgx1-v100"))
    assert sim.ecc(1).volatile_uncorrected == 0
    sim.set_ecc(1, volatile_uncorrected=2, remap_pending=True)
    assert (sim.ecc(1).volatile_uncorrected, sim.ecc(1).remap_pending) == (2, True)
    sim.set_nvlink_active(0, 0, False)
    assert not sim.nvlinks(0)[0].active
    sim.set_process(2, 4242, 3 * 1024 * MIB)
    assert sim.identity(2).memory_used_bytes == 3 * 1024 * MIB
    assert [p.pid for p in sim.processes(2)] == [4242]
    sim.clear_faults(0)
    sim.clear_faults(1)
    assert sim.nvlinks(0)[0].active and sim.ecc(1).volatile_uncorrected == 0


def test_mig_layout_can_be_set():
    """A simulated GPU's MIG layout can be set."""
    sim = SimulatedNvml(catalog_machine("dgx-a100"))
    assert sim.mig(0).mode is MigMode.UNSUPPORTED
    from node_agent.sources.nvml_reader import MigInfo

    layout = MigInfo(MigMode.ENABLED, (MigDevice("MIG-1", "3g.20gb", 1, 0, 19968),))
    sim.set_mig(0, layout)
    assert sim.mig(0) == layout


def test_fault_commands_from_json():
    """JSON fault commands apply the same faults as the methods."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    assert "XID 48" in sim.apply_fault({"gpu": 1, "xid": 48})
    assert sim.wait_event(0) == XidEvent(1, EventKind.XID, 48)
    sim.apply_fault({"gpu": 1, "ecc": {"volatileUncorrected": 1}})
    assert sim.ecc(1).volatile_uncorrected == 1
    sim.apply_fault({"gpu": 1, "process": {"pid": 7, "usedMiB": 100}})
    assert sim.processes(1)[0].used_memory_bytes == 100 * MIB
    sim.apply_fault({"gpu": 1, "nvlinkDown": 5})
    assert not sim.nvlinks(1)[5].active
    sim.apply_fault({"gpu": 1, "clear": True})
    assert sim.ecc(1).volatile_uncorrected == 0


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ({"xid": 48}, "'gpu'"),
        ({"gpu": 99, "xid": 48}, "no GPU with index 99"),
        ({"gpu": 0}, "exactly one of"),
        ({"gpu": 0, "xid": 48, "lost": True}, "exactly one of"),
        ({"gpu": 0, "bogus": 1}, "unknown keys: bogus"),
        ({"gpu": 0, "xid": "48"}, "'xid' must be an integer"),
        ({"gpu": 0, "ecc": {"nonsense": 1}}, "unknown ECC field"),
        ({"gpu": 0, "ecc": {"volatileUncorrected": -1}}, "must be a count"),
    ],
)
def test_bad_fault_commands_are_refused_with_a_reason(command, message):
    """Malformed fault commands are refused with a reason."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    with pytest.raises(FaultCommandError, match=message):
        sim.apply_fault(command)


def test_wait_event_wakes_up_when_a_fault_arrives_from_another_thread():
    """Waiting for an event wakes up when a fault arrives from another thread."""
    import threading

    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    threading.Timer(0.05, lambda: sim.inject_xid(0, 74)).start()
    assert sim.wait_event(5000) == XidEvent(0, EventKind.XID, 74)
