"""Node labels: what the node says about its GPUs, so that plain `nodeAffinity` works.

`node_labels` computes the labels from the discovered topology and the driver facts (pure);
`plan_labels` decides what to change on the Node (pure); `NodeLabeler` reads the Node and
carries the plan out through `NodeApi`, in one merge patch guarded by the Node's
resourceVersion.

Where NVIDIA GPU Feature Discovery (GFD) defines a label, its name and value format are used,
so that selectors written for GFD work on Linkpack nodes and the two agree:

| label | value |
| --- | --- |
| `nvidia.com/gpu.product` | the GPU name as NVML gives it, spaces replaced by `-` (`NVIDIA-A100-SXM4-40GB`) |
| `nvidia.com/gpu.count` | how many GPUs of that product the node has (`8`) |
| `nvidia.com/gpu.memory` | memory of one such GPU in MiB (`40960`) |
| `nvidia.com/mig.capable` | `true` when any GPU supports MIG (enabled or not), else `false` |
| `nvidia.com/cuda.driver.major`, `.minor`, `.rev` | the driver version's parts (`550`, `54`, `15`; `rev` is `""` for a two-part version) |
| `nvidia.com/cuda.runtime.major`, `.minor` | the CUDA version the driver runs (`12`, `4`) |

and beside them, names of our own (the first from the seed's affinity example):

| label | value |
| --- | --- |
| `topology.kubernetes.io/nvidia-sxm` | `true` for SXM modules (see `is_sxm`), else `false` |
| `nvidia.com/gpu.nvlink` | `true` when any GPU pair is NVLinked, else `false` |
| `nvidia.com/gpu.nvswitch` | `true` when the GPUs are joined by NVSwitch, else `false` |
| `linkpack.io/mps` | `true` while a CUDA MPS control daemon serves the node's shares, else `false` |
| `linkpack.io/nvlink-clique` | the size of the largest set of GPUs all pairwise NVLinked (`8`; `1` without NVLink) |
| `linkpack.io/numa-nodes` | how many NUMA nodes the GPUs are attached to (`2`) |

A label whose fact is unknown (no driver version, no GPU name, no NUMA node) is not set. When
the product is mixed, the most common one is labelled (as GFD, which labels one of them). A
value that is not a valid label value after the space rule (other characters, more than 63)
has the offending characters replaced by `-` and is cut to 63.

Rules (`plan_labels`), so that the agent coexists with GFD, NFD and operators:
- the agent records the labels it set, with the values it set, in the node annotation
  `linkpack.io/managed-labels` (a JSON object), and only ever adds or changes keys of
  `LABEL_KEYS` (the ones above; the node-agent admission policy allows exactly those);
- it adds a label that is absent, and changes or removes one only while it is its own: recorded,
  and still holding the recorded value. A label of its own that no longer applies (the hardware
  or the driver changed) is removed;
- a label it would set that already holds another value it did not set (GFD disagrees, an
  operator pinned it, or someone changed the agent's value) is left alone, dropped from the
  record and reported as a conflict (the status's `labelConflicts` and a `LabelConflict` Node
  event); a label that already holds the wanted value but was not set by the agent stays the
  other writer's;
- it never removes a label it did not set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from contract.keys import MANAGED_LABELS_ANNOTATION, MPS_LABEL, NUMA_NODES_LABEL, NVLINK_CLIQUE_LABEL
from node_agent.kube.node_api import KubeConflict, KubeError, NodeApi
from node_agent.sources.nvml_reader import parse_cuda_version
from topology.model import LinkKind, MigMode, NodeTopology
from topology.smi_parser import looks_like_nvswitch

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
CUDA_DRIVER_MAJOR_LABEL = "nvidia.com/cuda.driver.major"
CUDA_DRIVER_MINOR_LABEL = "nvidia.com/cuda.driver.minor"
CUDA_DRIVER_REV_LABEL = "nvidia.com/cuda.driver.rev"
CUDA_RUNTIME_MAJOR_LABEL = "nvidia.com/cuda.runtime.major"
CUDA_RUNTIME_MINOR_LABEL = "nvidia.com/cuda.runtime.minor"
NVLINK_LABEL = "nvidia.com/gpu.nvlink"
NVSWITCH_LABEL = "nvidia.com/gpu.nvswitch"
SXM_LABEL = "topology.kubernetes.io/nvidia-sxm"

#: Every label the agent may set (manifests/node-agent-policy.yaml allows exactly these).
LABEL_KEYS: frozenset[str] = frozenset(
    {
        GPU_PRODUCT_LABEL,
        GPU_COUNT_LABEL,
        GPU_MEMORY_LABEL,
        MIG_CAPABLE_LABEL,
        CUDA_DRIVER_MAJOR_LABEL,
        CUDA_DRIVER_MINOR_LABEL,
        CUDA_DRIVER_REV_LABEL,
        CUDA_RUNTIME_MAJOR_LABEL,
        CUDA_RUNTIME_MINOR_LABEL,
        NVLINK_LABEL,
        NVSWITCH_LABEL,
        SXM_LABEL,
        MPS_LABEL,
        NVLINK_CLIQUE_LABEL,
        NUMA_NODES_LABEL,
    }
)

_MAX_VALUE = 63
_NOT_IN_VALUE = re.compile(r"[^-A-Za-z0-9_.]")
_VERSION_PART = re.compile(r"[0-9A-Za-z]{1,16}")


@dataclass(frozen=True, slots=True)
class LabelFacts:
    """What the labels say beyond the topology: the driver and whether MPS serves shares."""

    driver_version: str = ""  # "550.54.15"; "" unknown
    cuda_driver_version: str = ""  # "12.4"; "" unknown
    mps_active: bool = False


# ----------------------------------------------------------------------------- what to label


def node_labels(topology: NodeTopology, facts: LabelFacts) -> dict[str, str]:
    """The labels this node should carry (see the module docstring); none without GPUs."""
    if not topology.gpus:
        return {}
    labels: dict[str, str] = {}
    product, count, memory_mib = _product(topology)
    if product:
        labels[GPU_PRODUCT_LABEL] = product
        labels[GPU_COUNT_LABEL] = str(count)
        if memory_mib > 0:
            labels[GPU_MEMORY_LABEL] = str(memory_mib)
    labels[MIG_CAPABLE_LABEL] = _bool(any(g.mig_mode is not MigMode.UNSUPPORTED for g in topology.gpus))
    labels.update(_driver_labels(facts.driver_version))
    labels.update(_cuda_labels(facts.cuda_driver_version))
    labels[SXM_LABEL] = _bool(is_sxm(topology))
    labels[NVLINK_LABEL] = _bool(any(lk.kind is LinkKind.NV for lk in topology.gpu_links))
    labels[NVSWITCH_LABEL] = _bool(has_nvswitch(topology))
    labels[MPS_LABEL] = _bool(facts.mps_active)
    labels[NVLINK_CLIQUE_LABEL] = str(nvlink_clique(topology))
    numa = {g.numa_node for g in topology.gpus if g.numa_node is not None}
    if numa:
        labels[NUMA_NODES_LABEL] = str(len(numa))
    return labels


def has_nvswitch(topology: NodeTopology) -> bool:
    """Discovery found NVSwitch, or the links are an all-to-all mesh too wide for direct NVLinks."""
    return topology.nvswitch or looks_like_nvswitch(topology.gpu_links, topology.gpu_count)


def is_sxm(topology: NodeTopology) -> bool:
    """Whether the GPUs are SXM modules (NVLink-connected data-centre boards), decided by:

    1. a GPU whose name says PCIe: no (a PCIe card, whatever its bridges);
    2. a GPU whose name says SXM ("A100-SXM4-40GB", "Tesla V100-SXM2-32GB"): yes;
    3. NVSwitch (only SXM modules sit on an NVSwitch baseboard, e.g. "H100 80GB HBM3" on HGX): yes;
    4. a GPU NVLinked to two or more peers (a cube mesh: NVLink bridges join only pairs of
       PCIe cards): yes;
    5. otherwise (PCIe cards, with or without bridged pairs): no.
    """
    names = [g.model.upper() for g in topology.gpus]
    if any("PCIE" in name for name in names):
        return False
    if any("SXM" in name for name in names):
        return True
    if has_nvswitch(topology):
        return True
    peers: dict[int, int] = {}
    for lk in topology.gpu_links:
        if lk.kind is LinkKind.NV:
            peers[lk.a] = peers.get(lk.a, 0) + 1
            peers[lk.b] = peers.get(lk.b, 0) + 1
    return any(n >= 2 for n in peers.values())


def nvlink_clique(topology: NodeTopology) -> int:
    """The size of the largest set of GPUs all pairwise NVLinked (1 without NVLink, 0 without GPUs)."""
    indices = [g.index for g in topology.gpus]
    if not indices:
        return 0
    position = {index: bit for bit, index in enumerate(indices)}
    adjacent = [0] * len(indices)
    for lk in topology.gpu_links:
        if lk.kind is LinkKind.NV and lk.a in position and lk.b in position:
            a, b = position[lk.a], position[lk.b]
            adjacent[a] |= 1 << b
            adjacent[b] |= 1 << a
    return _max_clique(adjacent, 0, (1 << len(indices)) - 1, 0)


def _max_clique(adjacent: list[int], size: int, candidates: int, excluded: int) -> int:
    """Bron-Kerbosch with a pivot, over bit masks: the largest clique extending the current one."""
    if not candidates:
        return size
    best = size
    union = candidates | excluded
    pivot = max(_bits(union), key=lambda v: (candidates & adjacent[v]).bit_count())
    for v in _bits(candidates & ~adjacent[pivot]):
        if size + 1 + (candidates & adjacent[v]).bit_count() > best:
            best = max(
                best, _max_clique(adjacent, size + 1, candidates & adjacent[v], excluded & adjacent[v])
            )
        candidates &= ~(1 << v)
        excluded |= 1 << v
    return best


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def label_value(text: str) -> str:
    """`text` as a label value: spaces (and any other character a value may not hold) become `-`,
    cut to 63 characters, with no `-`, `_` or `.` at either end."""
    value = _NOT_IN_VALUE.sub("-", text.strip())[:_MAX_VALUE]
    return value.strip("-_.")


def _product(topology: NodeTopology) -> tuple[str, int, int]:
    """The product label, how many GPUs are of it and the memory of one (most common model)."""
    counts: dict[str, int] = {}
    for g in topology.gpus:
        if g.model.strip():
            counts[g.model] = counts.get(g.model, 0) + 1
    if not counts:
        return "", 0, 0
    model = max(counts, key=lambda m: counts[m])  # ties: the first seen, i.e. the lowest index
    first = next(g for g in topology.gpus if g.model == model)
    return label_value(model), counts[model], first.memory_mib


def _driver_labels(version: str) -> dict[str, str]:
    parts = version.strip().split(".")
    if not 2 <= len(parts) <= 3 or not all(_VERSION_PART.fullmatch(p) for p in parts):
        return {}
    return {
        CUDA_DRIVER_MAJOR_LABEL: parts[0],
        CUDA_DRIVER_MINOR_LABEL: parts[1],
        CUDA_DRIVER_REV_LABEL: parts[2] if len(parts) == 3 else "",
    }


def _cuda_labels(version: str) -> dict[str, str]:
    parsed = parse_cuda_version(version)
    if parsed is None:
        return {}
    return {CUDA_RUNTIME_MAJOR_LABEL: str(parsed[0]), CUDA_RUNTIME_MINOR_LABEL: str(parsed[1])}


def _bool(value: bool) -> str:
    return "true" if value else "false"


# ----------------------------------------------------------------------------- what to change


@dataclass(frozen=True, slots=True)
class LabelConflict:
    """A label the agent would set that holds another value it did not set."""

    key: str
    found: str
    wanted: str

    @property
    def message(self) -> str:
        return (
            f"node label {self.key}={self.found!r} was not set by the node agent, which would set "
            f"{self.wanted!r}; left alone"
        )


@dataclass(frozen=True)
class LabelPlan:
    """What to change on the Node: `labels` to set (value) or remove (None), the list of the
    agent's own labels afterwards, and what is reported."""

    labels: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))
    managed: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    managed_changed: bool = False
    conflicts: tuple[LabelConflict, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def writes(self) -> bool:
        return bool(self.labels) or self.managed_changed

    @property
    def annotation(self) -> str | None:
        """The value of the managed-labels annotation after the plan (None: remove it)."""
        return encode_managed_labels(self.managed) if self.managed else None

    @property
    def reports(self) -> tuple[str, ...]:
        """The conflicts and problems as the status's `labelConflicts` shows them."""
        return (*(c.message for c in self.conflicts), *self.problems)


def encode_managed_labels(record: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(record.items())), separators=(",", ":"))


def decode_managed_labels(raw: str | None) -> tuple[dict[str, str], str]:
    """The agent's record of its labels, and what was wrong with the annotation ("" if nothing).
    Keys outside `LABEL_KEYS` are dropped: the agent never touches them."""
    if raw is None or not raw.strip():
        return {}, ""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        problem = (
            f"annotation {MANAGED_LABELS_ANNOTATION} is not a JSON object of label values; the agent "
            "rewrites it and treats the labels it finds as someone else's"
        )
        return {}, problem
    return {str(k): v for k, v in doc.items() if k in LABEL_KEYS}, ""


def plan_labels(
    desired: Mapping[str, str], current: Mapping[str, str], managed_annotation: str | None
) -> LabelPlan:
    """What to change so the Node carries `desired`, by the rules of the module docstring."""
    record, problem = decode_managed_labels(managed_annotation)
    changes: dict[str, str | None] = {}
    kept: dict[str, str] = {}
    conflicts: list[LabelConflict] = []
    for key in sorted(LABEL_KEYS):
        want, have = desired.get(key), current.get(key)
        ours = key in record and have == record[key]  # set by the agent and unchanged since
        if want is None:
            if ours:
                changes[key] = None  # its own label no longer applies
            continue
        if have is None or (ours and have != want):
            changes[key] = want  # absent (perhaps removed by someone): set it; or its own: update it
            kept[key] = want
        elif have == want:
            if ours:
                kept[key] = want
        else:
            conflicts.append(LabelConflict(key, have, want))
    annotation = encode_managed_labels(kept) if kept else None
    current_annotation = (managed_annotation or "").strip() or None
    return LabelPlan(
        labels=MappingProxyType(changes),
        managed=MappingProxyType(kept),
        managed_changed=annotation != current_annotation,
        conflicts=tuple(conflicts),
        problems=(problem,) if problem else (),
    )


# ----------------------------------------------------------------------------- applying


@dataclass(frozen=True)
class LabelOutcome:
    """What one reconciliation planned and whether it was written; `error` when it failed."""

    plan: LabelPlan | None = None
    wrote: bool = False
    error: str = ""


class NodeLabeler:
    """Keeps the node's labels as `node_labels` says, by the rules of the module docstring."""

    def __init__(self, api: NodeApi, node: str) -> None:
        self._api = api
        self._node = node

    def reconcile(self, desired: Mapping[str, str]) -> LabelOutcome:
        """Read the Node, plan, and write the changes in one patch at the resourceVersion read.

        A Node that changed in between (409) is left for the next call; so is any API failure."""
        try:
            metadata = self._api.get_node_metadata(self._node)
        except KubeError as exc:
            return LabelOutcome(error=f"cannot read node {self._node}: {exc}")
        plan = plan_labels(desired, metadata.labels, metadata.annotations.get(MANAGED_LABELS_ANNOTATION))
        if not plan.writes:
            return LabelOutcome(plan)
        try:
            self._api.patch_node_labels(
                self._node,
                plan.labels,
                {MANAGED_LABELS_ANNOTATION: plan.annotation},
                metadata.resource_version,
            )
        except KubeConflict:
            return LabelOutcome(
                plan, error=f"node {self._node} changed while it was being labelled; retrying"
            )
        except KubeError as exc:
            return LabelOutcome(plan, error=f"cannot label node {self._node}: {exc}")
        return LabelOutcome(plan, wrote=True)
