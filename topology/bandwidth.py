"""Link bandwidth in GB/s per direction, from the GPU model and the link kind.

Figures are the published per-link / per-slot rates (NVLink generations, PCIe x16 per
generation); the PCIe multipliers order the levels the way NVML does and are deliberately
conservative. One place holds them so that scoring, the graph and the debug views agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.model import LinkKind

# NVLink per-link, per-direction GB/s by generation.
_NVLINK_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# PCIe x16 per direction GB/s by generation.
_PCIE_X16 = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
# Share of the x16 rate a peer-to-peer transfer keeps at each PCIe level.
_PCIE_LEVEL_FACTOR = {
    LinkKind.INTERNAL: 0.9,
    LinkKind.PIX: 0.8,
    LinkKind.PXB: 0.75,
    LinkKind.PHB: 0.6,
    LinkKind.NODE: 0.5,
    LinkKind.SYS: 0.3,
}


@dataclass(frozen=True, slots=True)
class Generation:
    """What a GPU model implies for its links."""

    nvlink_gen: int  # 0 when unknown
    nvlink_per_link: float  # GB/s per direction per link (bridges differ from SXM)
    pcie_gen: int


# Matched in order against the upper-cased model name; first match wins.
_MODEL_TABLE: tuple[tuple[str, Generation], ...] = (
    ("B300", Generation(5, 50.0, 6)),
    ("B200", Generation(5, 50.0, 6)),
    ("GB200", Generation(5, 50.0, 6)),
    ("RTX PRO 6000", Generation(0, 0.0, 5)),
    ("H800", Generation(4, 25.0, 5)),
    ("H200", Generation(4, 25.0, 5)),
    ("H100", Generation(4, 25.0, 5)),
    ("H20", Generation(4, 25.0, 5)),
    ("GH200", Generation(4, 25.0, 5)),
    ("A6000", Generation(3, 14.0625, 4)),
    ("A40", Generation(3, 14.0625, 4)),
    ("A30", Generation(3, 25.0, 4)),
    ("A100", Generation(3, 25.0, 4)),
    ("A800", Generation(3, 25.0, 4)),
    ("RTX 5090", Generation(0, 0.0, 5)),
    ("RTX 4090", Generation(0, 0.0, 4)),
    ("RTX 3090", Generation(3, 14.0625, 4)),
    ("L40", Generation(0, 0.0, 4)),
    ("L4", Generation(0, 0.0, 4)),
    ("V100", Generation(2, 25.0, 3)),
    ("P100", Generation(1, 20.0, 3)),
    ("T4", Generation(0, 0.0, 3)),
    ("P40", Generation(0, 0.0, 3)),
    ("K80", Generation(0, 0.0, 3)),
    ("K40", Generation(0, 0.0, 3)),
)

#: What we assume for a GPU whose model is unknown: NVLink 3-class links, PCIe Gen4.
UNKNOWN_GENERATION = Generation(3, 25.0, 4)


def generation_of(model: str) -> Generation:
    """The link generation implied by a GPU model name (unknown models get a middle value)."""
    upper = model.upper()
    for needle, gen in _MODEL_TABLE:
        if needle in upper:
            return gen
    return UNKNOWN_GENERATION


def link_bandwidth(kind: LinkKind, nvlinks: int, model: str) -> float:
    """GB/s per direction between two GPUs of `model` joined by `kind` (and `nvlinks` links)."""
    gen = generation_of(model)
    pcie = _PCIE_X16.get(gen.pcie_gen, _PCIE_X16[4])
    if kind is LinkKind.NV:
        per_link = gen.nvlink_per_link or UNKNOWN_GENERATION.nvlink_per_link
        return round(nvlinks * per_link, 4)
    return round(pcie * _PCIE_LEVEL_FACTOR[kind], 4)


def pcie_bandwidth(model: str) -> float:
    """The x16 host link rate of a GPU model, GB/s per direction."""
    return _PCIE_X16.get(generation_of(model).pcie_gen, _PCIE_X16[4])
