"""Discovery: what GPUs this node has and how they are wired, from NVML and `nvidia-smi topo -m`.

Two steps, kept apart:
- fetching: `read_nvml(reader)` takes one `NvmlReading` through the `NvmlReader` seam, and
  the caller hands in `topo -m` text (see `smi_runner`);
- merging: `merge(snapshot, smi_topology)` is pure and decides, fact by fact, which source
  wins and records it in `Discovery.sources`.

Rules when both sources answer: identity, memory, PCI bus ids and MIG always come from NVML;
NUMA and CPU affinity from NVML when it knows them, else `topo -m`; GPU-GPU links from NVML's
NVLink enumeration and PCIe levels, with `topo -m` filling pairs NVML could not settle; NICs
only from `topo -m` (NVML does not see them). Every disagreement becomes a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TypeVar

from node_agent.sources.nvml_reader import (
    Affinity,
    DeviceIdentity,
    MigInfo,
    NvLinkInfo,
    NvmlError,
    NvmlReader,
    P2PCapability,
    P2PStatus,
    RemoteDeviceType,
    normalize_bus_id,
)
from topology.model import Gpu, GpuLink, LinkKind, MigMode, NodeTopology
from topology.smi_parser import parse_topo_matrix

SOURCE_TOPO = "nvidia-smi topo -m"
Pair = tuple[int, int]
T = TypeVar("T")


class DiscoveryError(Exception):
    """Neither NVML nor `topo -m` gave a usable picture of the node."""


@dataclass(frozen=True)
class NvmlReading:
    """Everything discovery reads from NVML, fetched once. Facts that failed are None."""

    source: str
    identities: tuple[DeviceIdentity, ...]
    affinities: tuple[Affinity | None, ...]
    levels: Mapping[Pair, LinkKind]
    nvlink_p2p: Mapping[Pair, P2PStatus]
    nvlinks: tuple[tuple[NvLinkInfo, ...] | None, ...]
    migs: tuple[MigInfo | None, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Discovery:
    """The merged topology, which source each fact came from, and what looked wrong."""

    topology: NodeTopology
    sources: Mapping[str, str]
    warnings: tuple[str, ...]


def discover(
    reader: NvmlReader | None, topo_text: str | None, model_hint: str = "", memory_hint_mib: int = 0
) -> Discovery:
    """Fetch from whichever sources exist and merge them. Raises `DiscoveryError` if none works."""
    warnings: list[str] = []
    snapshot: NvmlReading | None = None
    if reader is not None:
        try:
            snapshot = read_nvml(reader)
        except NvmlError as exc:
            warnings.append(f"NVML unusable, falling back to {SOURCE_TOPO}: {exc}")
    smi_topology: NodeTopology | None = None
    if topo_text is not None and topo_text.strip():
        model = model_hint or (snapshot.identities[0].name if snapshot and snapshot.identities else "")
        memory = memory_hint_mib or (
            snapshot.identities[0].memory_total_mib if snapshot and snapshot.identities else 0
        )
        try:
            parsed = parse_topo_matrix(topo_text, model=model, memory_mib=memory)
        except ValueError as exc:
            warnings.append(f"{SOURCE_TOPO} output unusable: {exc}")
        else:
            smi_topology = parsed.topology
            warnings.extend(f"{SOURCE_TOPO}: {w}" for w in parsed.warnings)
    result = merge(snapshot, smi_topology)
    all_warnings = (*warnings, *result.warnings)
    return Discovery(replace(result.topology, warnings=all_warnings), result.sources, all_warnings)


def read_nvml(reader: NvmlReader) -> NvmlReading:
    """Take every discovery fact from NVML. Only failing to count or name GPUs is fatal."""
    warnings: list[str] = []
    count = reader.device_count()
    identities = tuple(reader.identity(i) for i in range(count))
    affinities = _per_gpu(count, reader.affinity, "CPU/NUMA affinity", warnings)
    nvlinks = _per_gpu(count, reader.nvlinks, "NVLinks", warnings)
    migs = _per_gpu(count, reader.mig, "MIG state", warnings)
    levels: dict[Pair, LinkKind] = {}
    p2p: dict[Pair, P2PStatus] = {}
    for a in range(count):
        for b in range(a + 1, count):
            try:
                levels[(a, b)] = reader.topology_level(a, b)
                p2p[(a, b)] = reader.p2p_status(a, b, P2PCapability.NVLINK)
            except NvmlError as exc:
                warnings.append(f"GPU {a}-GPU {b}: path unreadable: {exc}")
    return NvmlReading(
        source=reader.source,
        identities=identities,
        affinities=affinities,
        levels=MappingProxyType(levels),
        nvlink_p2p=MappingProxyType(p2p),
        nvlinks=nvlinks,
        migs=migs,
        warnings=tuple(warnings),
    )


def _per_gpu(count: int, fetch: Callable[[int], T], what: str, warnings: list[str]) -> tuple[T | None, ...]:
    values: list[T | None] = []
    for i in range(count):
        try:
            values.append(fetch(i))
        except NvmlError as exc:
            values.append(None)
            warnings.append(f"GPU {i}: {what} unreadable: {exc}")
    return tuple(values)


@dataclass(frozen=True)
class NvmlLinks:
    """GPU-GPU links as NVML sees them; `unsettled` pairs are better taken from `topo -m`."""

    links: Mapping[Pair, GpuLink]
    unsettled: frozenset[Pair]
    nvswitch: bool
    warnings: tuple[str, ...]


def links_from_nvml(snapshot: NvmlReading) -> NvmlLinks:
    """Count NVLinks per GPU pair (via remote bus ids, or via switches) and fill PCIe levels."""
    count = len(snapshot.identities)
    index_of_bus = {normalize_bus_id(d.pci_bus_id): d.index for d in snapshot.identities if d.pci_bus_id}
    direct: dict[Pair, int] = {}
    seen_from: dict[tuple[int, int], int] = {}
    switch_links = [0] * count
    for i, gpu_links in enumerate(snapshot.nvlinks):
        for link in gpu_links or ():
            if not link.active:
                continue
            if link.remote_type is RemoteDeviceType.SWITCH:
                switch_links[i] += 1
                continue
            peer = index_of_bus.get(normalize_bus_id(link.remote_pci_bus_id))
            if peer is not None and peer != i:
                seen_from[(i, peer)] = seen_from.get((i, peer), 0) + 1
    warnings: list[str] = []
    for (i, peer), n in sorted(seen_from.items()):
        back = seen_from.get((peer, i))
        if back is not None and peer < i:
            continue  # already settled from the lower index
        pair = (min(i, peer), max(i, peer))
        if back is not None and back != n:
            warnings.append(f"GPU {i}-GPU {peer}: {n} NVLinks one way, {back} the other; using the smaller")
        direct[pair] = min(n, back) if back is not None else n
    nvswitch = any(switch_links)
    links: dict[Pair, GpuLink] = {}
    unsettled: set[Pair] = set()
    for a in range(count):
        for b in range(a + 1, count):
            pair = (a, b)
            p2p_nvlink = snapshot.nvlink_p2p.get(pair)
            if direct.get(pair):
                links[pair] = GpuLink(a, b, LinkKind.NV, direct[pair])
            elif switch_links[a] and switch_links[b] and p2p_nvlink in (None, P2PStatus.OK):
                links[pair] = GpuLink(a, b, LinkKind.NV, min(switch_links[a], switch_links[b]))
            elif p2p_nvlink is P2PStatus.OK:
                links[pair] = GpuLink(a, b, LinkKind.NV, 1)
                unsettled.add(pair)
                warnings.append(f"GPU {a}-GPU {b}: NVLink peer access OK but link count unknown")
            elif pair in snapshot.levels:
                links[pair] = GpuLink(a, b, snapshot.levels[pair])
                if snapshot.nvlinks[a] is None or snapshot.nvlinks[b] is None:
                    unsettled.add(pair)  # NVLinks unreadable: NVML cannot rule an NVLink out
            else:
                links[pair] = GpuLink(a, b, LinkKind.SYS)
                unsettled.add(pair)
    return NvmlLinks(MappingProxyType(links), frozenset(unsettled), nvswitch, tuple(warnings))


def merge(snapshot: NvmlReading | None, smi: NodeTopology | None) -> Discovery:
    """Combine the two sources fact by fact (pure). See the module docstring for the rules."""
    if snapshot is None and smi is None:
        raise DiscoveryError(f"no GPU information: NVML unavailable and no {SOURCE_TOPO} output")
    if snapshot is None:
        assert smi is not None
        sources = dict.fromkeys(("identity", "numa", "cpu_affinity", "links", "nvswitch"), SOURCE_TOPO)
        if smi.nics:
            sources["nics"] = SOURCE_TOPO
        return _finish(smi, sources, ())
    nvml_src = snapshot.source
    warnings = list(snapshot.warnings)
    nv = links_from_nvml(snapshot)
    warnings.extend(nv.warnings)
    if smi is not None and smi.gpu_count != len(snapshot.identities):
        warnings.append(
            f"{SOURCE_TOPO} lists {smi.gpu_count} GPUs but NVML sees {len(snapshot.identities)}; "
            f"ignoring {SOURCE_TOPO}"
        )
        smi = None
    gpus: list[Gpu] = []
    numa_src: set[str] = set()
    cpu_src: set[str] = set()
    for d in snapshot.identities:
        aff = snapshot.affinities[d.index]
        mig = snapshot.migs[d.index] or MigInfo(MigMode.UNSUPPORTED)
        other = smi.gpus[d.index] if smi is not None else None
        numa, numa_from = _prefer(
            aff.numa_node if aff else None, other.numa_node if other else None, nvml_src
        )
        cpus, cpu_from = _prefer(
            aff.cpulist if aff else None, other.cpu_affinity if other else None, nvml_src
        )
        gpu_numa, _ = _prefer(
            aff.gpu_numa_id if aff else None, other.gpu_numa_id if other else None, nvml_src
        )
        numa_src.add(numa_from)
        cpu_src.add(cpu_from)
        if other is not None and aff is not None:
            if aff.numa_node is not None and other.numa_node is not None and aff.numa_node != other.numa_node:
                warnings.append(
                    f"GPU {d.index}: NUMA node {aff.numa_node} (NVML) vs {other.numa_node} (topo -m)"
                )
            if aff.cpulist and other.cpu_affinity and aff.cpulist != other.cpu_affinity:
                warnings.append(
                    f"GPU {d.index}: CPU affinity {aff.cpulist} (NVML) vs {other.cpu_affinity} (topo -m)"
                )
        gpus.append(
            Gpu(
                index=d.index,
                uuid=d.uuid,
                model=d.name,
                memory_mib=d.memory_total_mib,
                pci_bus_id=d.pci_bus_id,
                numa_node=numa,
                cpu_affinity=cpus or "",
                gpu_numa_id=gpu_numa,
                mig_mode=mig.mode,
                mig_devices=mig.devices,
            )
        )
    links, link_src = _merge_links(nv, smi, nvml_src, warnings)
    topology = NodeTopology(
        gpus=tuple(gpus),
        gpu_links=links,
        nics=smi.nics if smi is not None else (),
        nic_links=smi.nic_links if smi is not None else (),
        nvswitch=nv.nvswitch or (smi.nvswitch if smi is not None else False),
    )
    sources = {
        "identity": nvml_src,
        "memory": nvml_src,
        "pci_bus_id": nvml_src,
        "mig": nvml_src,
        "numa": _joined(numa_src),
        "cpu_affinity": _joined(cpu_src),
        "links": link_src,
        "nvswitch": SOURCE_TOPO if smi is not None and smi.nvswitch and not nv.nvswitch else nvml_src,
    }
    if topology.nics:
        sources["nics"] = SOURCE_TOPO
    return _finish(topology, sources, tuple(warnings))


def _merge_links(
    nv: NvmlLinks, smi: NodeTopology | None, nvml_src: str, warnings: list[str]
) -> tuple[tuple[GpuLink, ...], str]:
    used: set[str] = set()
    merged: list[GpuLink] = []
    for pair in sorted(nv.links):
        mine = nv.links[pair]
        theirs = _smi_link(smi, pair)
        if pair in nv.unsettled and theirs is not None:
            merged.append(theirs)
            used.add(SOURCE_TOPO)
            continue
        if theirs is not None and _describe(mine) != _describe(theirs):
            warnings.append(
                f"GPU {pair[0]}-GPU {pair[1]}: NVML says {_describe(mine)}, "
                f"{SOURCE_TOPO} says {_describe(theirs)}; using NVML"
            )
        merged.append(mine)
        used.add(nvml_src)
    return tuple(merged), _joined(used) or nvml_src


def _smi_link(smi: NodeTopology | None, pair: Pair) -> GpuLink | None:
    if smi is None:
        return None
    try:
        return smi.link(*pair)
    except KeyError:
        return None


def _describe(link: GpuLink) -> str:
    return f"NV{link.nvlinks}" if link.kind is LinkKind.NV else link.kind.value


def _prefer(nvml_value: T | None, smi_value: T | None, nvml_src: str) -> tuple[T | None, str]:
    if nvml_value not in (None, ""):
        return nvml_value, nvml_src
    if smi_value not in (None, ""):
        return smi_value, SOURCE_TOPO
    return nvml_value, nvml_src


def _joined(sources: set[str]) -> str:
    return "+".join(sorted(sources))


def _finish(topology: NodeTopology, sources: dict[str, str], warnings: tuple[str, ...]) -> Discovery:
    frozen_sources = tuple(sorted(sources.items()))
    return Discovery(
        topology=replace(topology, sources=frozen_sources, warnings=warnings),
        sources=MappingProxyType(dict(frozen_sources)),
        warnings=warnings,
    )
