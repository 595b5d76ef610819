"""Versioned JSON form of a `NodeTopology` (the node agent publishes it as a CRD spec).

Shape (plain JSON, camelCase keys)::

    {"schemaVersion": "linkpack.io/topology/v1",
     "contentHash": "<sha256 hex of the facts>",
     "gpus": [{"index", "uuid", "model", "memoryMiB", "pciBusId", "numaNode", "cpuAffinity",
               "gpuNumaId", "migMode", "migDevices": [{"uuid", "profile", "gpuInstanceId",
               "computeInstanceId", "memoryMiB"}]}],
     "links": [{"a", "b", "kind", "nvlinks", "bandwidthGBps"}],
     "nics": [{"index", "name"}],
     "nicLinks": [{"gpu", "nic", "kind"}],
     "nvswitch": bool,
     "sources": [{"fact", "source"}],
     "warnings": [str]}

`bandwidthGBps` is derived (topology.bandwidth) for readers of the CRD and ignored on decode.
`contentHash` and `warnings` are optional on decode; a present `contentHash` must match.
`content_hash` covers the facts only: not warnings, not derived bandwidth.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from topology.bandwidth import link_bandwidth
from topology.model import Gpu, GpuLink, LinkKind, MigDevice, MigMode, Nic, NicLink, NodeTopology

SCHEMA_VERSION = "linkpack.io/topology/v1"

T = TypeVar("T")


class CodecError(ValueError):
    """A JSON document that is not a valid encoded topology; the message names the field."""


# ----------------------------------------------------------------------------- encode


def encode_topology(topology: NodeTopology) -> dict[str, Any]:
    """The JSON-ready dict for `topology`, including its content hash and warnings."""
    facts = canonical_facts(topology)
    digest = _hash_of(facts)
    models = {gpu.index: gpu.model for gpu in topology.gpus}
    for link, encoded in zip(topology.gpu_links, facts["links"], strict=True):
        encoded["bandwidthGBps"] = _pair_bandwidth(link, models)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "contentHash": digest,
        **{key: value for key, value in facts.items() if key != "schemaVersion"},
        "warnings": list(topology.warnings),
    }


def content_hash(topology: NodeTopology) -> str:
    """sha256 (hex) of the canonical JSON of the topology's facts; stable across runs."""
    return _hash_of(canonical_facts(topology))


def _hash_of(facts: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_text(facts).encode("ascii")).hexdigest()


def canonical_text(facts: dict[str, Any]) -> str:
    """The JSON text `content_hash` hashes: sorted keys, no spaces, ASCII only."""
    return json.dumps(facts, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def canonical_facts(topology: NodeTopology) -> dict[str, Any]:
    """What `content_hash` covers, as a JSON-ready dict (a fresh one on every call)."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "gpus": [_encode_gpu(gpu) for gpu in topology.gpus],
        "links": [
            {"a": link.a, "b": link.b, "kind": link.kind.value, "nvlinks": link.nvlinks}
            for link in topology.gpu_links
        ],
        "nics": [{"index": nic.index, "name": nic.name} for nic in topology.nics],
        "nicLinks": [{"gpu": nl.gpu, "nic": nl.nic, "kind": nl.kind.value} for nl in topology.nic_links],
        "nvswitch": topology.nvswitch,
        "sources": [{"fact": fact, "source": source} for fact, source in topology.sources],
    }


def _encode_gpu(gpu: Gpu) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "memoryMiB": gpu.memory_mib,
        "pciBusId": gpu.pci_bus_id,
        "numaNode": gpu.numa_node,
        "cpuAffinity": gpu.cpu_affinity,
        "gpuNumaId": gpu.gpu_numa_id,
        "migMode": gpu.mig_mode.value,
        "migDevices": [
            {
                "uuid": mig.uuid,
                "profile": mig.profile,
                "gpuInstanceId": mig.gpu_instance_id,
                "computeInstanceId": mig.compute_instance_id,
                "memoryMiB": mig.memory_mib,
            }
            for mig in gpu.mig_devices
        ],
    }


def _pair_bandwidth(link: GpuLink, models: Mapping[int, str]) -> float:
    """GB/s per direction; with two different models the slower side decides."""
    return min(
        link_bandwidth(link.kind, link.nvlinks, models.get(link.a, "")),
        link_bandwidth(link.kind, link.nvlinks, models.get(link.b, "")),
    )


# ----------------------------------------------------------------------------- decode


def decode_topology(data: object) -> NodeTopology:
    """The topology in an encoded dict; raises `CodecError` naming the first bad field."""
    return decode_with_hash(data)[0]


def decode_with_hash(data: object) -> tuple[NodeTopology, str]:
    """`decode_topology` and the decoded topology's `content_hash`, computed once."""
    root = _mapping(data, "topology")
    version = root.get("schemaVersion")
    if version != SCHEMA_VERSION:
        raise CodecError(f"schemaVersion: unsupported {version!r}, expected {SCHEMA_VERSION!r}")
    gpus = tuple(_items(root, "gpus", "gpus", _decode_gpu))
    _check_unique([gpu.index for gpu in gpus], "gpus", "index")
    gpu_indices = {gpu.index for gpu in gpus}
    links = tuple(_items(root, "links", "links", _decode_link))
    _check_unique([(link.a, link.b) for link in links], "links", "GPU pair")
    for i, link in enumerate(links):
        _check_known(link.a, gpu_indices, f"links[{i}].a")
        _check_known(link.b, gpu_indices, f"links[{i}].b")
    nics = tuple(_items(root, "nics", "nics", _decode_nic))
    _check_unique([nic.index for nic in nics], "nics", "index")
    nic_indices = {nic.index for nic in nics}
    nic_links = tuple(_items(root, "nicLinks", "nicLinks", _decode_nic_link))
    for i, nic_link in enumerate(nic_links):
        _check_known(nic_link.gpu, gpu_indices, f"nicLinks[{i}].gpu")
        _check_known(nic_link.nic, nic_indices, f"nicLinks[{i}].nic")
    sources = tuple(_items(root, "sources", "sources", _decode_source))
    warnings = tuple(string_list(root.get("warnings", []), "warnings"))
    topology = NodeTopology(
        gpus=gpus,
        gpu_links=links,
        nics=nics,
        nic_links=nic_links,
        nvswitch=_field(root, "nvswitch", bool, "topology"),
        sources=sources,
        warnings=warnings,
    )
    digest = content_hash(topology)
    stated = root.get("contentHash")
    if stated is not None and stated != digest:
        raise CodecError(f"contentHash: {stated!r} does not match the content ({digest})")
    return topology, digest


def _decode_gpu(item: Mapping[str, Any], where: str) -> Gpu:
    return Gpu(
        index=_index(item, "index", where),
        uuid=_field(item, "uuid", str, where),
        model=_field(item, "model", str, where),
        memory_mib=_index(item, "memoryMiB", where),
        pci_bus_id=_field(item, "pciBusId", str, where),
        numa_node=_optional_index(item, "numaNode", where),
        cpu_affinity=_field(item, "cpuAffinity", str, where),
        gpu_numa_id=_optional_index(item, "gpuNumaId", where),
        mig_mode=_enum(item, "migMode", MigMode, where),
        mig_devices=tuple(_items(item, "migDevices", f"{where}.migDevices", _decode_mig)),
    )


def _decode_mig(item: Mapping[str, Any], where: str) -> MigDevice:
    return MigDevice(
        uuid=_field(item, "uuid", str, where),
        profile=_field(item, "profile", str, where),
        gpu_instance_id=_index(item, "gpuInstanceId", where),
        compute_instance_id=_index(item, "computeInstanceId", where),
        memory_mib=_index(item, "memoryMiB", where),
    )


def _decode_link(item: Mapping[str, Any], where: str) -> GpuLink:
    a, b = _index(item, "a", where), _index(item, "b", where)
    kind = _enum(item, "kind", LinkKind, where)
    nvlinks = _index(item, "nvlinks", where)
    try:
        return GpuLink(a, b, kind, nvlinks)
    except ValueError as exc:
        raise CodecError(f"{where}: {exc}") from None


def _decode_nic(item: Mapping[str, Any], where: str) -> Nic:
    return Nic(_index(item, "index", where), _field(item, "name", str, where))


def _decode_nic_link(item: Mapping[str, Any], where: str) -> NicLink:
    return NicLink(
        _index(item, "gpu", where), _index(item, "nic", where), _enum(item, "kind", LinkKind, where)
    )


def _decode_source(item: Mapping[str, Any], where: str) -> tuple[str, str]:
    return _field(item, "fact", str, where), _field(item, "source", str, where)


# ----------------------------------------------------------------------------- field readers


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CodecError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _items(
    parent: Mapping[str, Any], key: str, where: str, decode: Callable[[Mapping[str, Any], str], T]
) -> list[T]:
    if key not in parent:
        raise CodecError(f"{where}: missing")
    value = parent[key]
    if not isinstance(value, list):
        raise CodecError(f"{where}: expected a list, got {type(value).__name__}")
    return [decode(_mapping(item, f"{where}[{i}]"), f"{where}[{i}]") for i, item in enumerate(value)]


def _field(item: Mapping[str, Any], key: str, kind: type[T], where: str) -> T:
    if key not in item:
        raise CodecError(f"{where}.{key}: missing")
    value = item[key]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise CodecError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _index(item: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(item, key, int, where)
    if value < 0:
        raise CodecError(f"{where}.{key}: must not be negative, got {value}")
    return value


def _optional_index(item: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in item:
        raise CodecError(f"{where}.{key}: missing")
    return None if item[key] is None else _index(item, key, where)


_E = TypeVar("_E", LinkKind, MigMode)


def _enum(item: Mapping[str, Any], key: str, enum: type[_E], where: str) -> _E:
    value = _field(item, key, str, where)
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum)
        raise CodecError(f"{where}.{key}: {value!r} is not one of {allowed}") from None


def string_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list):
        raise CodecError(f"{where}: expected a list of strings")
    for position, item in enumerate(value):
        if not isinstance(item, str):
            raise CodecError(f"{where}[{position}]: expected a string, got {type(item).__name__}")
    return list(value)


def _check_unique(keys: list[Any], where: str, what: str) -> None:
    seen: set[Any] = set()
    for key in keys:
        if key in seen:
            raise CodecError(f"{where}: {what} {key} appears twice")
        seen.add(key)


def _check_known(index: int, known: set[int], where: str) -> None:
    if index not in known:
        raise CodecError(f"{where}: {index} is not a listed index")
