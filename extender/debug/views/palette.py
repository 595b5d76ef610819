"""The debug page's visual vocabulary: colours and words for GPU states and link kinds.

One table per concept, read by both the SVG drawing (`extender.debug.views.svg`) and the HTML pages
(`extender.debug.views.pages`, whose legend lists them), so the legend always matches the picture.
GPU states are the words of `topology.gpu_status`; link kinds those of `topology.model.LinkKind`.
"""

from __future__ import annotations

from topology.model import LinkKind

#: Fill of a GPU box, by `topology.gpu_status.gpu_status`.
STATUS_COLOURS = {
    "free": "#b9e4c9",
    "shared": "#ffe082",
    "whole": "#64a8f0",
    "unhealthy": "#ef6f6c",
    "cordoned": "#b8b8b8",
}
STATUS_MEANING = {
    "free": "idle, can be handed out whole or shared",
    "shared": "partly used by GPU shares or MIG instances",
    "whole": "held whole by one pod",
    "unhealthy": "reported unhealthy by the node agent",
    "cordoned": "cordoned (linkpack.io/cordoned-gpus or node unschedulable)",
}
#: Stroke of a link, by kind.
KIND_COLOURS = {
    LinkKind.NV: "#3f9b0b",
    LinkKind.INTERNAL: "#009e9e",
    LinkKind.PIX: "#1f5fbf",
    LinkKind.PXB: "#7b4fc9",
    LinkKind.PHB: "#e07b00",
    LinkKind.NODE: "#8a5a44",
    LinkKind.SYS: "#c62828",
}
KIND_MEANING = {
    LinkKind.NV: "NVLink (direct or through NVSwitch)",
    LinkKind.INTERNAL: "same board (dual-GPU card)",
    LinkKind.PIX: "one PCIe switch",
    LinkKind.PXB: "several PCIe switches, no host bridge",
    LinkKind.PHB: "through a PCIe host bridge",
    LinkKind.NODE: "host bridges within one NUMA node",
    LinkKind.SYS: "across NUMA nodes (socket interconnect)",
}


def gib(mib: int) -> str:
    """MiB as GiB with one decimal, the unit the pages show memory in."""
    return f"{mib / 1024:.1f}"


def link_label(kind: LinkKind, nvlinks: int) -> str:
    """A link as `nvidia-smi topo -m` names it: "NV18" for NVLink, else the kind ("PIX", "SYS")."""
    return f"NV{nvlinks}" if kind is LinkKind.NV else kind.value
