"""Named real machines (captured `nvidia-smi topo -m` outputs) for tests, demos and simulate mode.

The files live in the shared data folder (`<shared>/data/topo`, see `shared_dir`); the few the
demo runs also ship inside this package (`topology/machines/`), so a bare install needs no
shared folder for them. `topo -m` has
no model, memory, UUID or PCI bus id: the profile supplies model and memory (memory is the
usual `nvidia-smi` total for that part where known, else the nominal capacity in MiB), and
`load_machine` synthesises deterministic UUIDs and PCI bus ids.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

from topology.model import Gpu, GpuLink, LinkKind, NodeTopology
from topology.smi_parser import TopologyParseError, parse_topo_matrix

SHARED_ENV = "LINKPACK_SHARED"
DGX2 = "dgx2"


class CatalogError(ValueError):
    """An unknown machine name, or a topology file that cannot be read."""


@dataclass(frozen=True, slots=True)
class MachineProfile:
    """One captured machine: its `topo -m` file and the facts the file does not hold."""

    name: str
    file: str
    model: str
    memory_mib: int
    description: str


def _profile(
    name: str, file: str, model: str, memory_mib: int, description: str
) -> tuple[str, MachineProfile]:
    return name, MachineProfile(name, file, model, memory_mib, description)


MACHINES: dict[str, MachineProfile] = dict(
    (
        _profile("dgx-a100", "dgx-a100-40gb-8gpu-10nic-8numa.txt", "A100-SXM4-40GB", 40960,
                 "DGX A100: 8x A100 NV12 over NVSwitch, 10 NICs, GPU pairs on NUMA 3/1/7/5"),
        _profile("hgx-a100-80gb", "hgx-a100-sxm4-80gb-8gpu-8nic.txt", "A100-SXM4-80GB", 81920,
                 "HGX A100 80GB: NV12 NVSwitch, 8 RoCE NICs in PXB pairs, 2 NUMA nodes"),
        _profile("hgx-h100", "hgx-h100-8gpu-no-nic.txt", "H100 80GB HBM3", 81559,
                 "HGX H100: 8x H100 NV18 NVSwitch, 2 NUMA nodes, no NICs shown"),
        _profile("hpe-xd670-h100", "hpe-xd670-h100-8gpu-12nic.txt", "H100 80GB HBM3", 81559,
                 "HPE Cray XD670: 8x H100 NV18, 12 NICs at PIX/PXB"),
        _profile("hgx-h800", "hgx-h800-8gpu-11nic-kvm.txt", "H800", 81559,
                 "HGX H800 in a KVM VM: NV8 NVSwitch (reduced NVLink), 11 NICs, PCIe flattened to PIX/PHB"),
        _profile("hgx-h20", "hgx-h20-8gpu-8nic.txt", "H20", 97871,
                 "HGX H20: NV18 NVSwitch, 8 NICs one per GPU at PIX"),
        _profile("hgx-h20-3e", "hgx-h20-3e-8gpu-2nic.txt", "H20-3e", 143771,
                 "HGX H20-3e decode node: NV18 NVSwitch, 2 NICs on GPU0 (memory nominal)"),
        _profile("hgx-h200", "hgx-h200-8gpu-10nic.txt", "H200", 143771,
                 "HGX H200: NV18 NVSwitch, 10 NICs, 2 NUMA nodes"),
        _profile("hgx-b300", "hgx-b300-8gpu-9nic-ansi.txt", "B300 SXM6 AC", 294912,
                 "HGX B300: NV18 NVSwitch, 9 NICs incl. a bond; header has escape-code remnants (memory nominal)"),
        _profile("della-a100-sys", "princeton-della-2xa100-sys-2nic.txt", "A100", 40960,
                 "Princeton Della: 2x A100 on different sockets (SYS), 2 NICs (memory nominal)"),
        _profile("dgx1-v100", "dgx1-v100-8gpu-1nic-fleetx.txt", "V100-SXM2-32GB", 32768,
                 "DGX-1V class: 8x V100 hybrid cube mesh (NV1/NV2), 1 NIC"),
        _profile("azure-nd40rs-v2", "azure-nd40rs-v2-8xv100-hybrid-cube-mesh.txt", "V100-SXM2-32GB", 32768,
                 "Azure ND40rs_v2: 8x V100 hybrid cube mesh, all GPUs report NUMA 0"),
        _profile("v100-cube-mesh", "v100-8gpu-hybrid-cube-mesh-pytorch-rpc-bench.txt", "V100", 16384,
                 "8x V100 hybrid cube mesh (pasted with indentation; memory nominal)"),
        _profile("dgx1-p100", "dgx1-p100-8gpu-4nic-oldlegend.txt", "Tesla P100-SXM2-16GB", 16384,
                 "DGX-1 (Pascal): NV1 cube mesh, SOC legend, 4 NICs; header cells ran together"),
        _profile("k40m-mlx4", "k40m-4gpu-mlx4-oldlegend.txt", "Tesla K40m", 11441,
                 "4x K40m, PHB pairs across 2 sockets, one ConnectX-3 (mlx4_0); SOC legend"),
        _profile("pcie-nv12-pairs", "pcie-8gpu-nv12-bridge-pairs.txt", "", 0,
                 "8 PCIe GPUs of unknown model with NV12 bridges 0-2, 1-3, 4-5, 6-7; everything else SYS"),
        _profile("pcie-all-sys", "pcie-8gpu-all-sys-unknown-model.txt", "", 0,
                 "8 PCIe GPUs of unknown model, every pair SYS, 2 NUMA nodes"),
        _profile("a100-pcie-bridge-pairs", "a100-4gpu-nvlink-bridge-pairs-2nic.txt", "A100", 40960,
                 "4x A100 PCIe: only GPU0-1 NV12 visible, GPU2-3 NODE (memory nominal)"),
        _profile("a30-pairs", "a30-4gpu-nvlink-bridge-pairs-1nic.txt", "A30", 24576,
                 "4x A30 with NV4 bridge pairs on two sockets, 1 NIC"),
        _profile("rtx-a6000-pairs", "rtx-a6000-8gpu-nvlink-bridge-pairs-2nic.txt", "RTX A6000", 49140,
                 "8x RTX A6000: NV4 bridge pairs, NODE within a socket, SYS across"),
        _profile("rtx4090-all-sys", "rtx4090-8gpu-all-sys-2nic-go-gpuallocator-17.txt", "RTX 4090", 24564,
                 "8x RTX 4090: every GPU pair SYS even within a socket (go-gpuallocator#17)"),
        _profile("rtx3090-2socket", "rtx3090-8gpu-2socket-pcie.txt", "RTX 3090", 24576,
                 "8x RTX 3090: NODE within a socket, SYS across"),
        _profile("rtx5090-2socket", "rtx5090-8gpu-2socket-pcie-2nic.txt", "RTX 5090", 32607,
                 "8x RTX 5090 prefill node: NODE/SYS, no NVLink, 2 NICs"),
        _profile("v100-pcie-pix-phb", "v100-pcie-4gpu-pix-phb.txt", "V100-PCIE-32GB", 32768,
                 "4x V100 PCIe on one socket: PIX pairs, PHB across"),
        _profile("rtx5090-2gpu-phb", "rtx5090-2gpu-phb.txt", "RTX 5090", 32607,
                 "Threadripper workstation: 2x RTX 5090 at PHB"),
        _profile("h100-pcie-1gpu", "h100-pcie-1gpu-1nic-kvm.txt", "H100 PCIe", 81559,
                 "KVM VM with a single H100 PCIe and one NIC at PHB"),
        _profile("rtx-pro-6000-1gpu", "rtx-pro-6000-blackwell-1gpu.txt", "RTX PRO 6000 Blackwell WS", 97887,
                 "Workstation with one RTX PRO 6000 Blackwell"),
    )
)  # fmt: skip


def shared_dir() -> Path:
    """The shared reference folder: $LINKPACK_SHARED, else `shared` next to the repository root."""
    configured = os.environ.get(SHARED_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "shared"


def topo_dir() -> Path:
    """Where the captured `topo -m` files live."""
    return shared_dir() / "data" / "topo"


#: The captured outputs that ship with the package (the demo's machines).
PACKAGED_DIR = Path(__file__).resolve().parent / "machines"


def machine_file(profile: MachineProfile) -> Path:
    """Where `profile`'s `topo -m` file is read from: the package's copy when it ships one,
    else the shared data folder."""
    packaged = PACKAGED_DIR / profile.file
    return packaged if packaged.is_file() else topo_dir() / profile.file


def machine_names() -> tuple[str, ...]:
    """Every name `load_machine` accepts, sorted (the synthetic DGX-2 included)."""
    return tuple(sorted((*MACHINES, DGX2)))


def load_machine(name_or_path: str | Path) -> NodeTopology:
    """A catalog machine by name, or any `topo -m` file by path, with UUIDs and bus ids filled in."""
    key = str(name_or_path)
    if key == DGX2:
        return synthetic_dgx2()
    profile = MACHINES.get(key)
    if profile is not None:
        path = machine_file(profile)
        if not path.is_file():
            raise CatalogError(
                f"machine {key!r}: its topology file {profile.file} is not in this package and "
                f"the shared data folder {topo_dir()} does not have it (set ${SHARED_ENV} to the "
                "folder holding data/topo)"
            )
        return _load(path, profile.name, profile.model, profile.memory_mib)
    path = Path(name_or_path)
    if path.suffix or path.parent != Path("."):
        return _load(path, path.stem, "", 0)
    raise CatalogError(f"unknown machine {key!r}; known: {', '.join(machine_names())}")


def _load(path: Path, machine: str, model: str, memory_mib: int) -> NodeTopology:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CatalogError(f"cannot read topology file {path}: {exc.strerror or exc}") from None
    try:
        parsed = parse_topo_matrix(text, model=model, memory_mib=memory_mib)
    except TopologyParseError as exc:
        raise CatalogError(f"{path.name}: {exc}") from None
    return with_synthetic_ids(parsed.topology, machine)


def synthetic_uuid(machine: str, index: int) -> str:
    """A stable, GPU-UUID-shaped id for GPU `index` of `machine`."""
    digest = hashlib.sha256(f"linkpack/{machine}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def synthetic_pci_bus_id(index: int) -> str:
    """A PCI bus id that sorts in GPU index order (as nvidia-smi numbering does)."""
    return f"00000000:{0x18 + 8 * index:02X}:00.0"


def with_synthetic_ids(topology: NodeTopology, machine: str) -> NodeTopology:
    """`topology` with empty UUIDs and PCI bus ids replaced by synthetic ones."""
    gpus = tuple(
        replace(
            gpu,
            uuid=gpu.uuid or synthetic_uuid(machine, gpu.index),
            pci_bus_id=gpu.pci_bus_id or synthetic_pci_bus_id(gpu.index),
        )
        for gpu in topology.gpus
    )
    return replace(topology, gpus=gpus)


def synthetic_dgx2() -> NodeTopology:
    """16x V100-SXM3-32GB behind NVSwitch (NV6 to all 15 peers), GPUs 0-7 on NUMA 0, 8-15 on NUMA 1.

    Built from the DGX-2 notes in the data index (the only capture seen was truncated); NICs are
    left out because the capture did not show their placement in full.
    """
    gpus = tuple(
        Gpu(
            index=i,
            uuid=synthetic_uuid(DGX2, i),
            model="Tesla V100-SXM3-32GB",
            memory_mib=32768,
            pci_bus_id=synthetic_pci_bus_id(i),
            numa_node=0 if i < 8 else 1,
            cpu_affinity="0-23,48-71" if i < 8 else "24-47,72-95",
        )
        for i in range(16)
    )
    links = tuple(GpuLink(a, b, LinkKind.NV, 6) for a in range(16) for b in range(a + 1, 16))
    return NodeTopology(
        gpus=gpus,
        gpu_links=links,
        nvswitch=True,
        sources=(("links", "synthetic DGX-2 (16x V100 NV6 over NVSwitch)"),),
    )
