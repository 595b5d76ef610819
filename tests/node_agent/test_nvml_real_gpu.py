"""The pynvml adapter and discovery on a real NVIDIA GPU (skipped without a driver).

Run with `pytest -m gpu tests/node_agent/test_nvml_real_gpu.py` (scripts/gpu-check.sh does).
Only NVML, nvidia-smi and the topology core are needed; nothing here touches Kubernetes.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from node_agent.sources.discovery import discover
from node_agent.sources.nvml_pynvml import PynvmlReader
from node_agent.sources.nvml_reader import (
    EccCounts,
    NvmlUnavailable,
    P2PCapability,
    P2PStatus,
    RemoteDeviceType,
    XidEvent,
)
from node_agent.sources.smi_runner import SmiError, run_topo_matrix
from topology.model import LinkKind, MigMode, parse_cpulist
from topology.smi_parser import parse_topo_matrix


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _driver_present(), reason="no NVIDIA driver (libnvidia-ml.so.1) on this machine"),
]

BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_PROFILE = re.compile(r"^\d+g\.\d+gb")


@pytest.fixture(scope="module")
def reader() -> Iterator[PynvmlReader]:
    try:
        opened = PynvmlReader.open()
    except NvmlUnavailable as exc:
        pytest.skip(f"NVML not usable: {exc}")
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def smi_text() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return run_topo_matrix()
    except SmiError:
        return None


def test_identity_is_sane(reader):
    """A real GPU has a UUID, a name, memory and a bus id."""
    count = reader.device_count()
    assert count >= 1
    assert reader.driver_version()
    identities = [reader.identity(i) for i in range(count)]
    for i, d in enumerate(identities):
        assert d.index == i
        assert GPU_UUID.match(d.uuid), d.uuid
        assert d.name
        assert d.memory_total_bytes > 1024**3 and 0 <= d.memory_used_bytes <= d.memory_total_bytes
        assert BUS_ID.match(d.pci_bus_id), d.pci_bus_id
    assert len({d.uuid for d in identities}) == count
    assert len({d.pci_bus_id for d in identities}) == count


def test_identity_matches_nvidia_smi_query(reader):
    """The identity NVML gives matches what `nvidia-smi --query-gpu` prints."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not installed")
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,memory.total,pci.bus_id", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    assert len(rows) == reader.device_count()
    for index, uuid, memory_mib, bus in rows:
        d = reader.identity(int(index))
        assert d.uuid == uuid
        assert abs(d.memory_total_mib - int(memory_mib)) <= 1
        assert d.pci_bus_id.upper() == bus.upper()


def test_affinity_and_levels(reader):
    """Every GPU has a sane affinity, and every pair a PCIe level."""
    count = reader.device_count()
    for i in range(count):
        a = reader.affinity(i)
        assert a.numa_node is None or a.numa_node >= 0
        assert parse_cpulist(a.cpulist) or a.cpulist == ""
    for a in range(count):
        for b in range(a + 1, count):
            assert reader.topology_level(a, b) is not LinkKind.NV
            for cap in P2PCapability:
                assert isinstance(reader.p2p_status(a, b, cap), P2PStatus)


def test_nvlinks_are_consistent(reader):
    """Link numbers are unique, active links have a generation, and GPU peers are GPUs of this machine."""
    buses = {reader.identity(i).pci_bus_id for i in range(reader.device_count())}
    for i in range(reader.device_count()):
        links = reader.nvlinks(i)
        assert len({lk.link for lk in links}) == len(links)
        for lk in links:
            if lk.active:
                assert lk.generation >= 1, lk
                if lk.remote_type is RemoteDeviceType.GPU:
                    assert lk.remote_pci_bus_id.upper() in {b.upper() for b in buses}


def test_mig_state_is_sane(reader):
    """MIG state is readable, and enabled GPUs list their instances."""
    for i in range(reader.device_count()):
        mig = reader.mig(i)
        if mig.mode is not MigMode.ENABLED:
            assert mig.devices == ()
            continue
        parent = reader.identity(i).memory_total_mib
        for d in mig.devices:
            assert d.uuid.startswith("MIG-")
            assert MIG_PROFILE.match(d.profile), d.profile
            assert 0 < d.memory_mib <= parent


def test_load_and_errors_read_without_raising(reader):
    """Processes, utilization and ECC counters read without raising."""
    for i in range(reader.device_count()):
        assert all(p.pid > 0 for p in reader.processes(i))
        u = reader.utilization(i)
        assert u is None or 0 <= u.gpu_percent <= 100
        assert isinstance(reader.ecc(i), EccCounts)
    event = reader.wait_event(10)
    assert event is None or isinstance(event, XidEvent)


def test_discovery_agrees_with_topo_m(reader, smi_text):
    """Discovery over the real NVML agrees with `topo -m` on this machine."""
    found = discover(reader, smi_text)
    topo = found.topology
    assert topo.gpu_count == reader.device_count()
    assert found.sources["identity"] == "nvml"
    nvml_switch = any(
        lk.remote_type is RemoteDeviceType.SWITCH for i in range(topo.gpu_count) for lk in reader.nvlinks(i)
    )
    assert topo.nvswitch == nvml_switch or (smi_text is not None and topo.nvswitch)
    if smi_text is None:
        pytest.skip("nvidia-smi topo -m not available; NVML-only discovery checked")
    parsed = parse_topo_matrix(smi_text).topology
    assert parsed.gpu_count == topo.gpu_count
    disagreements = [w for w in found.warnings if "says" in w]
    assert disagreements == []
    for link in parsed.gpu_links:
        ours = topo.link(link.a, link.b)
        assert (ours.kind is LinkKind.NV) == (link.kind is LinkKind.NV), (link, ours)
        assert ours.nvlinks == link.nvlinks, (link, ours)
    for mine, theirs in zip(topo.gpus, parsed.gpus, strict=True):
        if mine.numa_node is not None and theirs.numa_node is not None:
            assert mine.numa_node == theirs.numa_node


@pytest.mark.timeout(60)
def test_driver_cuda_and_power_facts_match_nvidia_smi(reader):
    """The CUDA version and power limits NVML gives (read only, nothing is set) match `nvidia-smi`."""
    cuda = reader.cuda_driver_version()
    assert cuda == "" or re.fullmatch(r"\d+\.\d+", cuda), cuda
    limits = [reader.power_limits(i) for i in range(reader.device_count())]
    for p in limits:
        assert not p.known or (0 < p.min_w <= p.limit_w <= p.max_w or p.max_w == 0), p
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not installed")
    header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30, check=True).stdout
    shown = re.search(r"CUDA Version:\s*(\d+\.\d+)", header)
    if shown and cuda:
        assert shown.group(1) == cuda
    query = subprocess.run(
        ["nvidia-smi", "--query-gpu=power.limit", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split("\n")
    for p, line in zip(limits, query, strict=False):
        if p.known and re.fullmatch(r"\s*[\d.]+\s*", line):
            assert abs(float(line) - p.limit_w) <= 1, (line, p)
