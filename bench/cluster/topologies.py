"""A realistic GPU topology for each openb node, by GPU model and count.

The trace says only how many GPUs of which model a node has, so "ours" (which places through
the extender's topology-aware `place`) needs wiring assumed from common server designs:

| model (trace name)        | class        | GPUs | wiring assumed                                      |
|---------------------------|--------------|------|-----------------------------------------------------|
| V100M16, V100M32, G2      | V100 SXM2    | 8    | DGX-1 hybrid cube mesh: NV1/NV2 bonds, SYS across  |
| V100M16, V100M32, G2      | V100 SXM2    | 4    | fully connected NVLink, 2 bonds per pair (NV2)      |
| G3, A10 (8-GPU), A100-ish | A100 class   | 8    | NVSwitch: every pair NV12                           |
| T4, P100, A10, anything   | PCIe         | 2, 4 | two sockets, half the GPUs each: same socket under |
|                           |              |      | one PCIe switch (PIX), across sockets SYS           |
| any                       | -            | 1    | a single GPU                                        |

G1/G2/G3 are undisclosed Alibaba codes. G2 (549 nodes of 8 GPUs, 96 cores, 384 GiB) is
taken as V100-class; G3 (39 nodes, 128 cores, 768 GiB) as A100-class. GPU memory is the
model's usual size (G2 32 GiB, G3 80 GiB assumed). GPUs keep the trace's model name, so
`topology.bandwidth` rates V100* as NVLink 2, P100/T4 as PCIe 3 and G2/G3 as its unknown
(NVLink 3 / PCIe 4) class.
"""

from __future__ import annotations

from functools import cache

from topology.model import Gpu, GpuLink, LinkKind, NodeTopology

GPU_MEMORY_MIB = {
    "P100": 16_384,
    "T4": 15_360,
    "V100M16": 16_384,
    "V100M32": 32_768,
    "A10": 24_576,
    "G2": 32_768,
    "G3": 81_920,
}
DEFAULT_GPU_MEMORY_MIB = 16_384

NVLINK_MESH_MODELS = frozenset({"V100M16", "V100M32", "G2"})
NVSWITCH_MODELS = frozenset({"G3", "A100"})

# DGX-1 (V100) hybrid cube mesh: (a, b, NVLink bonds); every other pair crosses sockets.
_HYBRID_CUBE_MESH = (
    (0, 1, 1),
    (0, 2, 1),
    (0, 3, 2),
    (0, 4, 2),
    (1, 2, 2),
    (1, 3, 1),
    (1, 5, 2),
    (2, 3, 2),
    (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1),
    (4, 6, 1),
    (4, 7, 2),
    (5, 6, 2),
    (5, 7, 1),
    (6, 7, 2),
)


def wiring_name(model: str, gpu_count: int) -> str:
    """Which of the table's wirings a node of `gpu_count` `model` GPUs gets."""
    if gpu_count <= 1:
        return "single"
    if model in NVSWITCH_MODELS and gpu_count >= 4:
        return "nvswitch"
    if model in NVLINK_MESH_MODELS and gpu_count == 8:
        return "hybrid-cube-mesh"
    if model in NVLINK_MESH_MODELS and gpu_count == 4:
        return "nvlink-full-mesh"
    return "pcie-two-socket"


def _socket(index: int, gpu_count: int) -> int:
    return 0 if index < max(1, gpu_count // 2) else 1


def _links(wiring: str, gpu_count: int) -> tuple[GpuLink, ...]:
    pairs = [(a, b) for a in range(gpu_count) for b in range(a + 1, gpu_count)]
    if wiring == "nvswitch":
        return tuple(GpuLink(a, b, LinkKind.NV, 12) for a, b in pairs)
    if wiring == "nvlink-full-mesh":
        return tuple(GpuLink(a, b, LinkKind.NV, 2) for a, b in pairs)
    if wiring == "hybrid-cube-mesh":
        bonds = {(a, b): n for a, b, n in _HYBRID_CUBE_MESH}
        return tuple(
            GpuLink(a, b, LinkKind.NV, bonds[(a, b)]) if (a, b) in bonds else GpuLink(a, b, LinkKind.SYS)
            for a, b in pairs
        )
    return tuple(
        GpuLink(a, b, LinkKind.PIX if _socket(a, gpu_count) == _socket(b, gpu_count) else LinkKind.SYS)
        for a, b in pairs
    )


@cache
def topology_for(model: str, gpu_count: int) -> NodeTopology:
    """The (shared, immutable) topology of every openb node with `gpu_count` `model` GPUs."""
    wiring = wiring_name(model, gpu_count)
    memory = GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{model}-{gpu_count}x-{i}",
            model=model,
            memory_mib=memory,
            numa_node=_socket(i, gpu_count),
        )
        for i in range(gpu_count)
    )
    return NodeTopology(
        gpus=gpus,
        gpu_links=_links(wiring, gpu_count),
        nvswitch=wiring == "nvswitch",
        sources=(("links", f"assumed: {wiring} (bench/cluster/topologies.py)"),),
    )
