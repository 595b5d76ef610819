"""Named GPU machines for tests, one builder per machine, named for the hardware.

Most are built by hand from link lists (no parser involved); their GPU UUIDs are
"GPU-<prefix>-<index>", the prefix defaulting to the machine's name, so tests can check grants
(machines sharing one in-memory cluster take distinct prefixes). `catalog_machine(name)` and
`topo_text(name)` give the topology catalog's machines, parsed from real `nvidia-smi topo -m`
captures (`topology.catalog`). `state()` is a node's scheduling state on a machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import combinations

from topology.catalog import MACHINES, load_machine, topo_dir
from topology.model import Gpu, GpuLink, LinkKind, MigDevice, MigMode, Nic, NicLink, NodeTopology
from topology.scheduling import GpuUsage, NodeState

Pair = tuple[int, int]


def build(
    name: str,
    count: int,
    model: str,
    memory_mib: int,
    link_of: Callable[[int, int], tuple[LinkKind, int]],
    numa_of: Callable[[int], int | None] = lambda i: None,
    nvswitch: bool = False,
    nics: Iterable[tuple[str, Callable[[int], LinkKind]]] = (),
) -> NodeTopology:
    """`count` GPUs "GPU-<name>-<index>", linked pairwise as `link_of` says."""
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=memory_mib, numa_node=numa_of(i))
        for i in range(count)
    )
    links = tuple(GpuLink(a, b, *link_of(a, b)) for a, b in combinations(range(count), 2))
    nic_list = tuple(nics)
    return NodeTopology(
        gpus=gpus,
        gpu_links=links,
        nics=tuple(Nic(i, nic_name) for i, (nic_name, _) in enumerate(nic_list)),
        nic_links=tuple(
            NicLink(g, n, kind_of(g)) for n, (_, kind_of) in enumerate(nic_list) for g in range(count)
        ),
        nvswitch=nvswitch,
    )


def _nv_table(
    table: dict[Pair, int], otherwise: Callable[[int, int], LinkKind]
) -> Callable[[int, int], tuple[LinkKind, int]]:
    def link_of(a: int, b: int) -> tuple[LinkKind, int]:
        links = table.get((a, b), 0)
        return (LinkKind.NV, links) if links else (otherwise(a, b), 0)

    return link_of


def _half(count: int) -> Callable[[int], int]:
    return lambda i: 0 if i < count // 2 else 1


def _same_half_or_sys(same: LinkKind, count: int = 8) -> Callable[[int, int], LinkKind]:
    return lambda a, b: same if (a < count // 2) == (b < count // 2) else LinkKind.SYS


# ---------------------------------------------------------------------- built by hand

# NVLink widths of the DGX-1 Volta hybrid cube mesh (go-gpuallocator's test node).
DGX1_V100_NVLINKS: dict[Pair, int] = {
    **{p: 2 for p in [(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)]},
    **{p: 1 for p in [(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)]},
}


def dgx1_v100() -> NodeTopology:
    """DGX-1 with 8x V100 SXM2: NV1/NV2 hybrid cube mesh, two sockets, SYS between halves."""
    return build(
        "dgx1v",
        8,
        "Tesla V100-SXM2-32GB",
        32768,
        _nv_table(DGX1_V100_NVLINKS, _same_half_or_sys(LinkKind.PHB)),
        _half(8),
    )


def hgx_h100(uuid_prefix: str = "hgx-h100", *, with_nics: bool = False) -> NodeTopology:
    """HGX H100 8-GPU: NV18 to every peer through NVSwitch; GPUs 0-3 on NUMA 0, 4-7 on NUMA 1.

    With `with_nics`, NIC0..NIC3 ("mlx5_0".."mlx5_3") each sit behind the PCIe switch of a GPU
    pair (0-1, 2-3, 4-5, 6-7): PIX to that pair, NODE to the same socket, SYS across.
    """

    def nic(pair: int) -> tuple[str, Callable[[int], LinkKind]]:
        def kind(g: int) -> LinkKind:
            if g // 2 == pair:
                return LinkKind.PIX
            return LinkKind.NODE if (g < 4) == (pair < 2) else LinkKind.SYS

        return (f"mlx5_{pair}", kind)

    return build(
        uuid_prefix,
        8,
        "NVIDIA H100 80GB HBM3",
        81559,
        lambda a, b: (LinkKind.NV, 18),
        _half(8),
        nvswitch=True,
        nics=[nic(p) for p in range(4)] if with_nics else (),
    )


def a100_pcie_nv12_pairs() -> NodeTopology:
    """8x A100 PCIe with NV12 bridges on (0,2), (1,3), (4,5), (6,7); everything else SYS."""
    bridges = {(0, 2): 12, (1, 3): 12, (4, 5): 12, (6, 7): 12}
    return build(
        "nv12-pairs",
        8,
        "NVIDIA A100 80GB PCIe",
        81920,
        _nv_table(bridges, lambda a, b: LinkKind.SYS),
        _half(8),
    )


def rtx3090_two_socket(uuid_prefix: str = "rtx3090") -> NodeTopology:
    """8x RTX 3090 on two sockets: NODE within a socket, SYS across, no NVLink."""
    return build(
        uuid_prefix,
        8,
        "NVIDIA GeForce RTX 3090",
        24576,
        lambda a, b: (_same_half_or_sys(LinkKind.NODE)(a, b), 0),
        _half(8),
    )


def rtx4090_two_socket_all_sys() -> NodeTopology:
    """8x RTX 4090 where every pair is SYS (go-gpuallocator #17); NUMA alone separates sockets."""
    return build("rtx4090", 8, "NVIDIA GeForce RTX 4090", 24564, lambda a, b: (LinkKind.SYS, 0), _half(8))


def dgx2_v100() -> NodeTopology:
    """DGX-2: 16x V100 SXM3 behind NVSwitch (NV6 to every peer), two sockets."""
    return build(
        "dgx2", 16, "Tesla V100-SXM3-32GB", 32768, lambda a, b: (LinkKind.NV, 6), _half(16), nvswitch=True
    )


def a100_sxm_mig_pair(profiles: Iterable[str] = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")) -> NodeTopology:
    """2x A100 80GB SXM, NV12, both in MIG mode with the same instances carved."""
    gpus = []
    for i in range(2):
        devices = tuple(
            MigDevice(f"MIG-{i}-{j}", profile, j + 1, 0, int(profile.split(".")[1].rstrip("gb")) * 1024)
            for j, profile in enumerate(profiles)
        )
        gpus.append(
            Gpu(
                i,
                f"GPU-mig-{i}",
                "NVIDIA A100-SXM4-80GB",
                81920,
                mig_mode=MigMode.ENABLED,
                mig_devices=devices,
            )
        )
    return NodeTopology(gpus=tuple(gpus), gpu_links=(GpuLink(0, 1, LinkKind.NV, 12),))


# ---------------------------------------------------------------------- from the catalog


def catalog_machine(name: str) -> NodeTopology:
    """A catalog machine ("dgx-a100", "hgx-h100", ...) parsed from its `topo -m` capture."""
    return load_machine(name)


def topo_text(name: str) -> str:
    """The `nvidia-smi topo -m` capture of a catalog machine."""
    return (topo_dir() / MACHINES[name].file).read_text()


def dgx_a100() -> NodeTopology:
    """DGX A100 (8x A100 SXM4 40GB, NVSwitch, 10 NICs, four NUMA nodes), from the catalog."""
    return catalog_machine("dgx-a100")


def dgx_a100_with_mig() -> NodeTopology:
    """A DGX A100 whose GPU 7 is in MIG mode with seven 1g.10gb instances (UUIDs in the driver's
    format, memory filled in where the capture has none)."""
    base = dgx_a100()
    gpus = []
    for g in base.gpus:
        g = replace(
            g, uuid=f"GPU-0000000{g.index}-aaaa-bbbb-cccc-dddddddddddd", memory_mib=g.memory_mib or 81920
        )
        if g.index == 7:
            migs = tuple(
                MigDevice(f"MIG-0000000{k}-aaaa-bbbb-cccc-eeeeeeeeeeee", "1g.10gb", k + 7, 0, 9728)
                for k in range(7)
            )
            g = replace(g, mig_mode=MigMode.ENABLED, mig_devices=migs)
        gpus.append(g)
    return replace(base, gpus=tuple(gpus))


# ---------------------------------------------------------------------- scheduling state


def state(
    topology: NodeTopology,
    used: Iterable[int] = (),
    unhealthy: Iterable[int] = (),
    cordoned: Iterable[int] = (),
    name: str = "node-a",
) -> NodeState:
    """A node with `used` GPUs held whole and the given GPUs unhealthy or cordoned."""
    used_set, sick, fenced = set(used), set(unhealthy), set(cordoned)
    usage = tuple(
        GpuUsage(whole=i in used_set, healthy=i not in sick, cordoned=i in fenced)
        for i in range(topology.gpu_count)
    )
    return NodeState(name, topology, usage)
