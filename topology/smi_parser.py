"""Read `nvidia-smi topo -m` text into a `NodeTopology`.

Accepted: every legend era (SOC / SYS+NODE / NIC aliases + `GPU NUMA ID`), tab- or
space-separated cells, NIC columns under raw names (`mlx5_0`, `mlx4_0`, `mlx5_bond_0`) or
`NIC<k>` aliases resolved through the `NIC Legend:` block, and the affinity columns
`CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID` in any subset. Empty cells (trailing tabs on NIC
rows, the blank cell current drivers print before `GPU NUMA ID`) are normal output and ignored.

Recoverable damage is repaired and reported in `ParseResult.warnings` (see `topology.smi_cells`
for the cell-level repairs; here: indented rows, unknown codes, one-sided unknown codes, missing
NIC rows, NIC aliases without a legend, affinity cells that cannot be placed).

Anything else raises `TopologyParseError` naming the line: empty or binary input, a header that
does not start at GPU0, unknown row labels, rows with the wrong number of link cells, a
missing `X` on the diagonal, missing or repeated GPU rows, an asymmetric matrix, malformed
affinity values. A matrix is never returned half-read.

NVSwitch heuristic (`looks_like_nvswitch`): `topo -m` does not print switches, so a node is
taken to be NVSwitch-based when it has at least 4 GPUs, every GPU pair is `NV<c>` with the
same `c`, and a direct mesh would need more than `MAX_NVLINKS_PER_GPU` (18, the most any GPU
generation has) links per GPU, i.e. `c * (gpus - 1) > 18`. This calls 8x A100 NV12, 8x
H100/H200/B300 NV18, 8x H800 NV8 and 16x V100 NV6 (DGX-2) switched, and keeps direct meshes
(P100/V100 cube meshes, 4x A100 NV4, 4x H100 / GH200 NV6, DGX Station NV2) unswitched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from topology.model import Gpu, GpuLink, LinkKind, Nic, NicLink, NodeTopology, parse_cpulist
from topology.smi_cells import (
    CPU_AFFINITY,
    GPU_NUMA_ID,
    NUMA_AFFINITY,
    Cell,
    Header,
    Line,
    TopologyParseError,
    clean_lines,
    is_code_shaped,
    parse_header,
    read_cell,
    split_merged_codes,
    split_row_label,
)

__all__ = [
    "MAX_NVLINKS_PER_GPU",
    "SOURCE",
    "ParseResult",
    "TopologyParseError",
    "looks_like_nvswitch",
    "parse_topo_matrix",
]

SOURCE = "nvidia-smi topo -m"
#: The most NVLinks any GPU generation exposes (H100/H200/B200/B300: 18).
MAX_NVLINKS_PER_GPU = 18

_NIC_LEGEND_ENTRY_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass(frozen=True, slots=True)
class ParseResult:
    """The topology read from the text and what had to be repaired to read it."""

    topology: NodeTopology
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    label: str
    cells: tuple[Cell, ...]
    extra: tuple[str, ...]  # tokens after the link cells (affinity values)


def parse_topo_matrix(text: str, *, model: str = "", memory_mib: int = 0) -> ParseResult:
    """Parse one `nvidia-smi topo -m` output. `model` and `memory_mib` are applied to every GPU."""
    warnings: list[str] = []
    lines = clean_lines(text, warnings)
    header_at = next((i for i, line in enumerate(lines) if line.text.strip()), None)
    if header_at is None:
        raise TopologyParseError(
            1, "nothing but terminal escape codes: expected the output of `nvidia-smi topo -m`"
        )
    header = parse_header(lines[header_at], warnings)
    rows, matrix_end = _read_rows(lines, header_at + 1, header, warnings)
    _check_row_set(lines[header_at].number, header, rows, warnings)
    _warn_unknown_codes(rows, warnings)

    gpu_links = _gpu_links(header, rows, warnings)
    nics = _nics(header, lines[matrix_end:], warnings)
    nic_links = _nic_links(header, rows, warnings)
    _check_nic_pairs(header, rows)
    gpus = tuple(
        _gpu(i, rows[f"GPU{i}"], header, model, memory_mib, warnings) for i in range(header.gpu_count)
    )
    topology = NodeTopology(
        gpus=gpus,
        gpu_links=gpu_links,
        nics=nics,
        nic_links=nic_links,
        nvswitch=looks_like_nvswitch(gpu_links, len(gpus)),
        sources=(("links", SOURCE),),
        warnings=tuple(warnings),
    )
    return ParseResult(topology, tuple(warnings))


def looks_like_nvswitch(gpu_links: Sequence[GpuLink], gpu_count: int) -> bool:
    """True when the links can only be an NVSwitch fabric (see the module docstring)."""
    if gpu_count < 4 or len(gpu_links) != gpu_count * (gpu_count - 1) // 2:
        return False
    counts = {link.nvlinks for link in gpu_links}
    if len(counts) != 1:
        return False
    (count,) = counts
    return count > 0 and count * (gpu_count - 1) > MAX_NVLINKS_PER_GPU


# ----------------------------------------------------------------------------- rows


def _read_rows(
    lines: list[Line], start: int, header: Header, warnings: list[str]
) -> tuple[dict[str, _Row], int]:
    """Matrix rows by label, and the index of the first line after the matrix."""
    rows: dict[str, _Row] = {}
    indented: list[int] = []
    index = start
    while index < len(lines):
        line = lines[index]
        stripped = line.text.strip()
        if not stripped or stripped.startswith(("Legend", "NIC Legend")):
            break
        if line.text[0] in " \t":
            indented.append(line.number)
        row = _read_row(line, header, warnings)
        if row.label in rows:
            raise TopologyParseError(
                line.number, f"row {row.label} appears twice (first on line {rows[row.label].line})"
            )
        rows[row.label] = row
        index += 1
    if indented:
        warnings.append(f"matrix rows are indented (lines {indented[0]}-{indented[-1]}); indentation ignored")
    return rows, index


def _read_row(line: Line, header: Header, warnings: list[str]) -> _Row:
    labels = header.device_labels
    label, tokens = split_row_label(line, labels, warnings)
    tokens = split_merged_codes(line, tokens, warnings)
    code_count = 0
    while code_count < len(tokens) and is_code_shaped(tokens[code_count]):
        code_count += 1
    if code_count != len(labels):
        raise TopologyParseError(
            line.number,
            f"row {label} has {code_count} link cells but the header has {len(labels)} device columns",
        )
    cells = tuple(read_cell(token) for token in tokens[:code_count])
    own = labels.index(label)
    for column, cell in enumerate(cells):
        if (column == own) != (cell.kind is None):
            expected = "X" if column == own else "a link code"
            raise TopologyParseError(
                line.number, f"row {label}, column {labels[column]}: expected {expected}, found {cell.raw!r}"
            )
    return _Row(line.number, label, cells, tuple(tokens[code_count:]))


def _check_row_set(header_line: int, header: Header, rows: dict[str, _Row], warnings: list[str]) -> None:
    missing_gpus = [f"GPU{i}" for i in range(header.gpu_count) if f"GPU{i}" not in rows]
    if len(missing_gpus) == header.gpu_count:
        raise TopologyParseError(header_line + 1, "no GPU rows after the header")
    if missing_gpus:
        raise TopologyParseError(
            header_line,
            f"the header lists {header.gpu_count} GPUs but there are "
            f"{header.gpu_count - len(missing_gpus)} GPU rows (missing {', '.join(missing_gpus)})",
        )
    missing_nics = [label for label in header.nic_labels if label not in rows]
    if missing_nics:
        warnings.append(
            f"no rows for NIC column(s) {', '.join(missing_nics)}; their GPU links come from the GPU rows only"
        )


def _warn_unknown_codes(rows: dict[str, _Row], warnings: list[str]) -> None:
    first_seen: dict[str, int] = {}
    counts: dict[str, int] = {}
    for row in sorted(rows.values(), key=lambda r: r.line):
        for cell in row.cells:
            if cell.guessed:
                first_seen.setdefault(cell.raw, row.line)
                counts[cell.raw] = counts.get(cell.raw, 0) + 1
    for code in sorted(counts):
        warnings.append(
            f"line {first_seen[code]}: unknown link code {code!r} ({counts[code]} cell(s)) treated as SYS"
        )


# ----------------------------------------------------------------------------- links


def _agree(first: _Row, first_col: int, second: _Row, second_col: int, warnings: list[str]) -> Cell:
    """The cell `first` → column `first_col`, checked against its mirror in `second`."""
    one, other = first.cells[first_col], second.cells[second_col]
    if (one.kind, one.nvlinks) == (other.kind, other.nvlinks):
        return one
    pair = f"{first.label}↔{second.label}"
    if one.guessed != other.guessed:
        known = other if one.guessed else one
        guess = one if one.guessed else other
        warnings.append(
            f"{pair}: unknown code {guess.raw!r} on one side; used {known.raw!r} from the other side"
        )
        return known
    raise TopologyParseError(
        second.line,
        f"asymmetric matrix: {first.label}→{second.label} is {one.raw} (line {first.line}) "
        f"but {second.label}→{first.label} is {other.raw}",
    )


def _gpu_links(header: Header, rows: dict[str, _Row], warnings: list[str]) -> tuple[GpuLink, ...]:
    links: list[GpuLink] = []
    for a in range(header.gpu_count):
        for b in range(a + 1, header.gpu_count):
            cell = _agree(rows[f"GPU{a}"], b, rows[f"GPU{b}"], a, warnings)
            kind = cell.kind or LinkKind.SYS
            links.append(GpuLink(a, b, kind, cell.nvlinks if kind is LinkKind.NV else 0))
    return tuple(links)


def _nic_links(header: Header, rows: dict[str, _Row], warnings: list[str]) -> tuple[NicLink, ...]:
    links: list[NicLink] = []
    for gpu in range(header.gpu_count):
        gpu_row = rows[f"GPU{gpu}"]
        for nic, label in enumerate(header.nic_labels):
            column = header.gpu_count + nic
            if label in rows:
                cell = _agree(gpu_row, column, rows[label], gpu, warnings)
            else:
                cell = gpu_row.cells[column]
            links.append(NicLink(gpu, nic, cell.kind or LinkKind.SYS))
    return tuple(links)


def _check_nic_pairs(header: Header, rows: dict[str, _Row]) -> None:
    """NIC↔NIC cells are not kept, but an asymmetric pair still means a damaged matrix."""
    offset = header.gpu_count
    labels = header.nic_labels
    for i, first in enumerate(labels):
        for j in range(i + 1, len(labels)):
            if first in rows and labels[j] in rows:
                _agree(rows[first], offset + j, rows[labels[j]], offset + i, [])


def _nics(header: Header, after_matrix: list[Line], warnings: list[str]) -> tuple[Nic, ...]:
    legend: dict[str, str] = {}
    in_legend = False
    for line in after_matrix:
        if line.text.strip() == "NIC Legend:":
            in_legend = True
            continue
        entry = _NIC_LEGEND_ENTRY_RE.match(line.text) if in_legend else None
        if entry:
            legend[entry.group(1)] = entry.group(2)
    unresolved = [label for label in header.nic_labels if label.startswith("NIC") and label not in legend]
    if unresolved:
        warnings.append(f"no NIC Legend entry for {', '.join(unresolved)}; kept the alias as the NIC name")
    unused = sorted(set(legend) - set(header.nic_labels))
    if unused:
        warnings.append(f"NIC Legend lists {', '.join(unused)}, which the matrix does not have; ignored")
    return tuple(Nic(index, legend.get(label, label)) for index, label in enumerate(header.nic_labels))


# ----------------------------------------------------------------------------- GPUs


def _gpu(index: int, row: _Row, header: Header, model: str, memory_mib: int, warnings: list[str]) -> Gpu:
    columns = header.affinity_columns
    values = row.extra
    if len(values) > len(columns):
        raise TopologyParseError(
            row.line,
            f"row {row.label} has {len(values)} values after its link cells ({' '.join(values)}) "
            f"but the header has {len(columns)} affinity column(s)",
        )
    if len(values) < len(columns):
        warnings.append(
            f"line {row.line}: row {row.label} has {len(values)} value(s) for {len(columns)} affinity "
            "column(s); its affinity is left unknown"
        )
        return Gpu(index, model=model, memory_mib=memory_mib)
    by_column = dict(zip(columns, values, strict=True))
    return Gpu(
        index,
        model=model,
        memory_mib=memory_mib,
        numa_node=_numa_node(row, by_column.get(NUMA_AFFINITY, "N/A")),
        cpu_affinity=_cpu_affinity(row, by_column.get(CPU_AFFINITY, "N/A")),
        gpu_numa_id=_gpu_numa_id(row, by_column.get(GPU_NUMA_ID, "N/A")),
    )


def _cpu_affinity(row: _Row, value: str) -> str:
    if value == "N/A":
        return ""
    try:
        parse_cpulist(value)
    except ValueError:
        raise TopologyParseError(
            row.line, f"row {row.label}: CPU Affinity {value!r} is not a CPU list"
        ) from None
    return value


def _numa_node(row: _Row, value: str) -> int | None:
    """A single NUMA node number; a list of nodes (or N/A) means no single node."""
    if value == "N/A":
        return None
    try:
        nodes = parse_cpulist(value)
    except ValueError:
        raise TopologyParseError(
            row.line, f"row {row.label}: NUMA Affinity {value!r} is not a node list"
        ) from None
    return next(iter(nodes)) if len(nodes) == 1 else None


def _gpu_numa_id(row: _Row, value: str) -> int | None:
    if value == "N/A":
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 6):
        raise TopologyParseError(row.line, f"row {row.label}: GPU NUMA ID {value[:40]!r} is not a number")
    return int(value)
