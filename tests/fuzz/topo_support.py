"""Synthetic `nvidia-smi topo -m` captures shaped like real ones, and the parser's contract.

`Shape` describes a machine the way `topo -m` prints it (GPU and NIC matrix, legend era, NIC
aliases, affinity columns, tabs or spaces); `render` prints it. The fuzz tests draw shapes at
random and mutate their renderings; `SEED_SHAPES` are a few shapes of real captures in
`<shared>/data/topo/` (generated here, never copied), written to `corpus/topo/` by

    python -m tests.fuzz.topo_support --write-corpus

`summarize` runs in the sandbox process (see `tests.fuzz.sandbox`) and returns plain data.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topology.catalog import topo_dir
from topology.smi_parser import parse_topo_matrix

CORPUS = Path(__file__).parent / "corpus"
TOPO_CORPUS = CORPUS / "topo"
PARSE_ERROR = "topology.smi_cells.TopologyParseError"
AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
#: What each code reads as (kind, nvlinks) in the parser's model.
_KIND = {"SYS": "SYS", "SOC": "SYS", "NODE": "NODE", "PHB": "PHB", "PXB": "PXB", "PIX": "PIX", "PSB": "PIX"}

_LEGEND_SOC = """Legend:

  X   = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing a single PCIe switch
  NV#  = Connection traversing a bonded set of # NVLinks"""

_LEGEND_SYS = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


@dataclass(frozen=True)
class Shape:
    """One machine as `topo -m` prints it. `codes[i][j]` is the cell of device i's row, column j
    (devices: the GPUs, then the NICs); the diagonal is "X"."""

    gpus: int
    nic_names: tuple[str, ...]
    codes: tuple[tuple[str, ...], ...]
    affinity: tuple[str, ...]  # the affinity columns printed, in AFFINITY order
    gpu_affinity: tuple[tuple[str, ...], ...]  # per GPU, one value per affinity column
    nic_aliases: bool = True  # NIC<k> columns and a "NIC Legend:" block, else the raw names
    soc_legend: bool = False
    tabs: bool = True
    centred_x: bool = True  # " X " as current drivers print the diagonal
    nic_trailing_cells: bool = True  # NIC rows end with empty affinity cells (tabs)
    blank_before_gpu_numa_id: bool = True  # the empty cell current drivers print
    legend: bool = True

    @property
    def labels(self) -> tuple[str, ...]:
        nics = tuple(f"NIC{i}" for i in range(len(self.nic_names))) if self.nic_aliases else self.nic_names
        return (*(f"GPU{i}" for i in range(self.gpus)), *nics)

    def expected(self) -> dict[str, Any]:
        """What the parser must read from `render(self)` (the `summarize` form)."""
        links = []
        for a in range(self.gpus):
            for b in range(a + 1, self.gpus):
                code = self.codes[a][b]
                if code.startswith("NV"):
                    links.append((a, b, "NV", int(code[2:])))
                else:
                    links.append((a, b, _KIND[code], 0))
        nic_links = [
            (g, n, _KIND[self.codes[g][self.gpus + n]])
            for g in range(self.gpus)
            for n in range(len(self.nic_names))
        ]
        return {"gpus": self.gpus, "links": links, "nics": list(self.nic_names), "nic_links": nic_links}


def render(shape: Shape) -> str:
    """The `nvidia-smi topo -m` text of `shape`."""
    sep = "\t" if shape.tabs else "  "
    affinity_header = list(shape.affinity)
    if "GPU NUMA ID" in affinity_header and shape.blank_before_gpu_numa_id and shape.tabs:
        affinity_header.insert(affinity_header.index("GPU NUMA ID"), "")
    lines = [sep + sep.join([*shape.labels, *[a for a in affinity_header if a]])]
    for row, label in enumerate(shape.labels):
        cells = [(" X " if shape.centred_x else "X") if c == "X" else c for c in shape.codes[row]]
        if row < shape.gpus:
            values = list(shape.gpu_affinity[row])
            if "GPU NUMA ID" in shape.affinity and shape.blank_before_gpu_numa_id and shape.tabs:
                values.insert(shape.affinity.index("GPU NUMA ID"), "")
            cells += values
        elif shape.nic_trailing_cells and shape.tabs:
            cells += [""] * len(shape.affinity)
        lines.append(sep.join([label, *cells]))
    if shape.legend:
        lines += ["", _LEGEND_SOC if shape.soc_legend else _LEGEND_SYS]
    if shape.nic_aliases and shape.nic_names:
        lines += ["", "NIC Legend:", ""] + [f"  NIC{i}: {name}" for i, name in enumerate(shape.nic_names)]
    return "\n".join(lines) + "\n"


def summarize(text: str) -> dict[str, Any]:
    """The parse of `text` as plain data (runs in the sandbox process)."""
    result = parse_topo_matrix(text)
    topology = result.topology
    return {
        "gpus": len(topology.gpus),
        "links": [(link.a, link.b, link.kind.value, link.nvlinks) for link in topology.gpu_links],
        "nics": [nic.name for nic in topology.nics],
        "nic_links": [(nl.gpu, nl.nic, nl.kind.value) for nl in topology.nic_links],
        "warnings": list(result.warnings),
    }


class ParserContractError(AssertionError):
    """The parser broke its contract: it hung, crashed, let another exception escape, or raised
    its own error without a usable line number. The message carries the child's traceback."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind  # "hung", "crashed", "escaped <type>" or "bad line number"


def check_parser(sandbox: Any, text: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The parse summary, or None when the parser refused `text` as it promises to (a
    TopologyParseError whose message starts with `line N:` for a line of the input); raises
    ParserContractError otherwise."""
    outcome = sandbox.call("tests.fuzz.topo_support:summarize", text, timeout_s=timeout_s)
    head = f"input of {len(text)} chars, {text.count(chr(10)) + 1} lines, starting {text[:120]!r}"
    if outcome.hung:
        raise ParserContractError("hung", f"no result within {timeout_s:.0f}s; {head}")
    if outcome.crashed:
        raise ParserContractError("crashed", f"{outcome.crashed}; {head}")
    if not outcome.error_type:
        return dict(outcome.value)
    if outcome.error_type != PARSE_ERROR:
        raise ParserContractError(
            f"escaped {outcome.error_type}",
            f"{outcome.message}; {head}\n--- traceback in the sandbox ---\n{outcome.traceback}",
        )
    line_no = outcome.attributes.get("line_no")
    lines = text.count("\n") + 1
    if not isinstance(line_no, int) or not 1 <= line_no <= lines + 1:
        raise ParserContractError(
            "bad line number", f"line_no={line_no!r} for {lines} lines: {outcome.message}"
        )
    if not outcome.message.startswith(f"line {line_no}: ") or len(outcome.message) <= len(
        f"line {line_no}: "
    ):
        raise ParserContractError(
            "bad line number", f"message does not start with 'line {line_no}: ': {outcome.message!r}"
        )
    return None


def real_captures() -> dict[str, str]:
    """The real captures in `<shared>/data/topo/` by file name, read as the catalog reads them
    ($LINKPACK_SHARED, else ../shared); empty when the folder is not there."""
    directory = topo_dir()
    if not directory.is_dir():
        return {}
    return {p.name: p.read_text(encoding="utf-8", errors="replace") for p in sorted(directory.glob("*.txt"))}


# ---------------------------------------------------------------------- shapes of real captures


def _symmetric(size: int, cell: Any) -> tuple[tuple[str, ...], ...]:
    return tuple(
        tuple("X" if i == j else cell(min(i, j), max(i, j)) for j in range(size)) for i in range(size)
    )


def _hgx_h200_like() -> Shape:
    """8 GPUs NV18 (NVSwitch), 10 NIC aliases with a legend, two NUMA nodes, GPU NUMA ID column."""
    gpus, nics = 8, 10
    near = {0: 3, 1: 5, 2: 4, 3: 0, 4: 7, 5: 9, 6: 8, 7: 6}

    def cell(i: int, j: int) -> str:
        if j < gpus:
            return "NV18"
        if i < gpus:  # GPU i, NIC j - gpus
            nic = j - gpus
            same_socket = (i < 4) == (nic < 6)
            return "PIX" if near[i] == nic else ("NODE" if same_socket else "SYS")
        return "PIX" if (i - gpus) // 3 == (j - gpus) // 3 else ("NODE" if (i < 14) == (j < 14) else "SYS")

    affinity = tuple(
        ("0-63,128-191", "0", "N/A") if g < 4 else ("64-127,192-255", "1", "N/A") for g in range(gpus)
    )
    return Shape(
        gpus, tuple(f"mlx5_{i}" for i in range(nics)), _symmetric(gpus + nics, cell), AFFINITY, affinity
    )


def _dgx1_p100_like() -> Shape:
    """8 GPUs in an NV1 hybrid cube mesh, SOC legend, raw mlx5 names, CPU Affinity only."""
    gpus = 8
    mesh = {(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7), (4, 5), (4, 6),
            (4, 7), (5, 6), (5, 7), (6, 7)}  # fmt: skip

    def cell(i: int, j: int) -> str:
        if j < gpus:
            return "NV1" if (i, j) in mesh else "SOC"
        if i < gpus:
            return "PIX" if (j - gpus) == i // 2 else ("PHB" if (i < 4) == (j - gpus < 2) else "SOC")
        return "PHB" if (i - gpus < 2) == (j - gpus < 2) else "SOC"

    affinity = tuple(("0-19,40-59",) if g < 4 else ("20-39,60-79",) for g in range(gpus))
    names = ("mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3")
    return Shape(gpus, names, _symmetric(gpus + 4, cell), ("CPU Affinity",), affinity, nic_aliases=False,
                 soc_legend=True, centred_x=False, nic_trailing_cells=False)  # fmt: skip


def _k40m_like() -> Shape:
    """4 GPUs at PHB pairs across two sockets, one mlx4 NIC, spaces, SOC legend."""

    def cell(i: int, j: int) -> str:
        if j < 4:
            return "PHB" if i // 2 == j // 2 else "SOC"
        return "PHB" if i < 2 else "SOC"

    affinity = tuple(("0-7,16-23",) if g < 2 else ("8-15,24-31",) for g in range(4))
    return Shape(4, ("mlx4_0",), _symmetric(5, cell), ("CPU Affinity",), affinity, nic_aliases=False,
                 soc_legend=True, tabs=False, centred_x=False)  # fmt: skip


def _della_like() -> Shape:
    """2 GPUs on different sockets (SYS), 2 raw-named NICs, CPU and NUMA affinity."""

    def cell(i: int, j: int) -> str:
        return "SYS" if j < 2 else ("PXB" if (i, j) in {(0, 2), (1, 3)} else "SYS")

    affinity = (("0-27", "0"), ("28-55", "1"))
    return Shape(2, ("mlx5_0", "mlx5_1"), _symmetric(4, cell), ("CPU Affinity", "NUMA Affinity"), affinity,
                 nic_aliases=False)  # fmt: skip


def _one_gpu_like() -> Shape:
    """One GPU and nothing else (workstation)."""
    return Shape(1, (), (("X",),), AFFINITY, (("0-31", "0", "N/A"),), legend=True)


SEED_SHAPES: dict[str, Shape] = {
    "shape-hgx-h200-8gpu-nv18-10nic": _hgx_h200_like(),
    "shape-dgx1-p100-8gpu-nv1-mesh-soc": _dgx1_p100_like(),
    "shape-k40m-4gpu-phb-mlx4-spaces": _k40m_like(),
    "shape-della-2gpu-sys-2nic": _della_like(),
    "shape-1gpu-workstation": _one_gpu_like(),
}


def write_corpus() -> list[Path]:
    """Write the rendered seed shapes as `corpus/topo/ok-<name>.txt`; the paths written."""
    TOPO_CORPUS.mkdir(parents=True, exist_ok=True)
    written = []
    for name, shape in SEED_SHAPES.items():
        path = TOPO_CORPUS / f"ok-{name}.txt"
        path.write_text(render(shape))
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-corpus", action="store_true", help="write the seed shapes into corpus/topo/")
    args = parser.parse_args()
    if args.write_corpus:
        for path in write_corpus():
            print(path)
    else:
        for name, shape in SEED_SHAPES.items():
            print(f"# {name}\n{render(shape)}")


if __name__ == "__main__":
    main()
