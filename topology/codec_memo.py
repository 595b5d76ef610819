"""Decode each distinct wiring once: the codec's decode for fleets of identical machines.

Thousands of nodes of one machine shape publish topologies that differ only in per-GPU identity:
each GPU's `uuid`, `pciBusId` and `memoryMiB`. `decode_with_hash` keys a memo on everything else
the decoder reads and, on a hit, builds the node's topology from the shape's decoded template with
only those three fields substituted, and its content hash from the template's canonical text with
only their encodings substituted. The result is always exactly what `codec.decode_with_hash`
returns; anything the fast path cannot vouch for (a miss, a field of an unexpected type, a
contentHash that does not match, warnings that are not strings) takes the full decode, which also
raises the same `CodecError` it always did.

The key is the pickle of the shape's JSON values. For what `json.loads` produces (dict, list, str,
int, float, bool, None) equal pickles are equal values of equal types (True, 1 and 1.0 differ, and
so do a list and a tuple); a value of another type pickles with its class, or not at all, and then
decodes in full. A shape gets a template the second time it is seen, so machines that are each
unique (MIG devices have per-node UUIDs, which stay part of the key) cost one key and a full decode.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import threading
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple, cast

from topology.codec import canonical_facts, canonical_text
from topology.codec import decode_with_hash as full_decode_with_hash
from topology.model import Gpu, NodeTopology

#: The per-GPU fields a node substitutes into its shape's template, in slot order.
IDENTITY = ("uuid", "pciBusId", "memoryMiB")
#: Shapes with a template (oldest dropped first beyond this) and keys seen once (forgotten beyond).
MAX_TEMPLATES = 128
MAX_SEEN = 4096

_MARK = "\x00linkpack-identity-{}\x00"
_MARK_RE = re.compile(r'"\\u0000linkpack-identity-([0-9]+)\\u0000"')


@dataclass(frozen=True, slots=True)
class _Template:
    """A decoded shape: its topology and its canonical text cut where identity goes."""

    topology: NodeTopology
    texts: tuple[str, ...]  # canonical text around the identity slots, one more than `slots`
    slots: tuple[int, ...]  # per gap in `texts`: 3 * GPU position + position in IDENTITY


_templates: dict[bytes, _Template] = {}
_seen: set[int] = set()
_lock = threading.Lock()


def decode_with_hash(data: object) -> tuple[NodeTopology, str]:
    """`codec.decode_with_hash(data)`, the same topology and hash, the same errors, cheaper."""
    key = _shape_key(data)
    if key is None:
        return full_decode_with_hash(data)
    template = _templates.get(key)
    if template is not None:
        fast = _from_template(template, cast(dict[str, Any], data))  # a dict: _shape_key said so
        if fast is not None:
            return fast
    decoded = full_decode_with_hash(data)
    if template is None:
        _remember(key, decoded[0])
    return decoded


class MemoSize(NamedTuple):
    """How much is memoised: shapes with a template, and shape keys seen once."""

    templates: int
    seen: int


def memo_size() -> MemoSize:
    """What the memo holds now (tests; the answers never depend on it)."""
    with _lock:
        return MemoSize(len(_templates), len(_seen))


def forget() -> None:
    """Drop every memoised shape (tests; the answers never depend on what is memoised)."""
    with _lock:
        _templates.clear()
        _seen.clear()


def _shape_key(data: object) -> bytes | None:
    """The pickle of what the decoder reads except per-GPU identity, or None (decode in full)."""
    if type(data) is not dict:
        return None
    gpus = data.get("gpus")
    if type(gpus) is not list:
        return None
    shapes = []
    for gpu in gpus:
        if type(gpu) is not dict:
            return None
        shape = gpu.copy()
        for field in IDENTITY:
            shape.pop(field, None)
        shapes.append(shape)
    read = ("schemaVersion", "links", "nics", "nicLinks", "nvswitch", "sources")
    try:
        return pickle.dumps((shapes, *(data.get(k) for k in read)), protocol=5)
    except Exception:  # unpicklable: not JSON values, so not worth a shape
        return None


def _from_template(template: _Template, root: dict[str, Any]) -> tuple[NodeTopology, str] | None:
    """The node's topology and hash from its shape's template, or None when anything is unusual."""
    base = template.topology
    gpus: list[Gpu] = []
    encoded: list[str] = []
    for gpu, item in zip(base.gpus, root["gpus"], strict=True):
        uuid, pci, memory = item.get("uuid"), item.get("pciBusId"), item.get("memoryMiB")
        if type(uuid) is not str or type(pci) is not str or type(memory) is not int or memory < 0:
            return None
        gpus.append(
            Gpu(
                index=gpu.index,
                uuid=uuid,
                model=gpu.model,
                memory_mib=memory,
                pci_bus_id=pci,
                numa_node=gpu.numa_node,
                cpu_affinity=gpu.cpu_affinity,
                gpu_numa_id=gpu.gpu_numa_id,
                mig_mode=gpu.mig_mode,
                mig_devices=gpu.mig_devices,
            )
        )
        encoded += (encode_basestring_ascii(uuid), encode_basestring_ascii(pci), str(memory))
    warnings = root.get("warnings", [])
    if type(warnings) is not list or any(type(w) is not str for w in warnings):
        return None
    digest = hashlib.sha256(_fill(template, encoded).encode("ascii")).hexdigest()
    stated = root.get("contentHash")
    if stated is not None and stated != digest:
        return None
    topology = NodeTopology(
        gpus=tuple(gpus),
        gpu_links=base.gpu_links,
        nics=base.nics,
        nic_links=base.nic_links,
        nvswitch=base.nvswitch,
        sources=base.sources,
        warnings=tuple(warnings),
    )
    return topology, digest


def _fill(template: _Template, encoded: list[str]) -> str:
    pieces = [template.texts[0]]
    for slot, text in zip(template.slots, template.texts[1:], strict=True):
        pieces += (encoded[slot], text)
    return "".join(pieces)


def _remember(key: bytes, topology: NodeTopology) -> None:
    """Count a sighting of the shape; on its second, make its template."""
    digest = hash(key)
    with _lock:
        if digest not in _seen:
            if len(_seen) >= MAX_SEEN:
                _seen.clear()
            _seen.add(digest)
            return
    template = _template_of(topology)
    if template is None:
        return
    with _lock:
        while len(_templates) >= MAX_TEMPLATES:
            del _templates[next(iter(_templates))]
        _templates[key] = template


def _template_of(topology: NodeTopology) -> _Template | None:
    """The template, or None when the canonical text cannot be cut safely (a mark in the data)."""
    facts = canonical_facts(topology)
    real = canonical_text(facts)
    if "linkpack-identity-" in real:
        return None
    for position, gpu in enumerate(facts["gpus"]):
        for offset, field in enumerate(IDENTITY):
            gpu[field] = _MARK.format(3 * position + offset)
    cut = _MARK_RE.split(canonical_text(facts))
    texts, slots = tuple(cut[0::2]), tuple(int(s) for s in cut[1::2])
    template = _Template(topology, texts, slots)
    own = [
        text
        for gpu in topology.gpus
        for text in (
            encode_basestring_ascii(gpu.uuid),
            encode_basestring_ascii(gpu.pci_bus_id),
            str(gpu.memory_mib),
        )
    ]
    if sorted(slots) != list(range(3 * topology.gpu_count)) or _fill(template, own) != real:
        return None
    return template
