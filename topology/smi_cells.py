"""The lexical half of the `nvidia-smi topo -m` parser: clean lines, split the header, read cells.

Everything here works on single lines and single cells. `topology.smi_parser` assembles the
pieces into a matrix and checks it as a whole. Both raise `TopologyParseError` and nothing else.

Recoveries made here (each reported through the caller's warning list):
* ANSI escape sequences, and their remnants without the ESC byte (`[4m`, `[0m`), are removed.
* Header cells that ran together when tabs were lost (`GPU0GPU1...GPU7mlx5_0`) are split
  before every `GPU<n>`, `NIC<n>` and `mlx<n>_` name.
* Link cells that ran together (`PXBNODE`, `NV12NV12`) are split when the whole token is a
  sequence of legend codes.
* A row label glued to its first cell (`GPU0NV12`) is separated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topology.model import LinkKind


class TopologyParseError(ValueError):
    """`nvidia-smi topo -m` text that cannot be read without guessing; names the line and the fault."""

    def __init__(self, line_no: int, message: str) -> None:
        super().__init__(f"line {line_no}: {message}")
        self.line_no = line_no
        self.message = message


#: The two- and three-word affinity columns, in the order drivers print them.
CPU_AFFINITY = "CPU Affinity"
NUMA_AFFINITY = "NUMA Affinity"
GPU_NUMA_ID = "GPU NUMA ID"
AFFINITY_COLUMNS = (CPU_AFFINITY, NUMA_AFFINITY, GPU_NUMA_ID)

_ANSI_RE = re.compile(r"\x1b?\[[0-9;]*m")
_AFFINITY_RE = re.compile(r"CPU\s*Affinity|NUMA\s*Affinity|GPU\s*NUMA\s*ID")
_DEVICE_SPLIT_RE = re.compile(r"(?=GPU\d)|(?=NIC\d)|(?=mlx\d_)")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
_NIC_ALIAS_RE = re.compile(r"^NIC\d+$")
_RAW_NIC_RE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_CODE_RE = re.compile(r"X|NV\d+|SYS|SOC|NODE|PHB|PXB|PIX|PSB")
_CODE_RUN_RE = re.compile(f"(?:{_CODE_RE.pattern})+")
_CODE_SHAPED_RE = re.compile(r"^[A-Z][A-Z0-9#]{0,7}$")
_NV_RE = re.compile(r"^NV([0-9]{1,3})$")  # more digits than any real NVLink count: an unknown code

# Codes with a fixed meaning. `SOC` is the pre-384 spelling of SYS; `PSB` ("a single on-board
# PCIe switch", an intermediate-era code) is read as PIX.
_FIXED_CODES = {
    "SYS": LinkKind.SYS,
    "SOC": LinkKind.SYS,
    "NODE": LinkKind.NODE,
    "PHB": LinkKind.PHB,
    "PXB": LinkKind.PXB,
    "PIX": LinkKind.PIX,
    "PSB": LinkKind.PIX,
}


@dataclass(frozen=True, slots=True)
class Line:
    """One input line after cleaning, with its 1-based number in the original text."""

    number: int
    text: str


@dataclass(frozen=True, slots=True)
class Header:
    """The column layout the header line declares."""

    gpu_count: int
    nic_labels: tuple[str, ...]  # `NIC0` aliases or raw device names, in column order
    affinity_columns: tuple[str, ...]  # subset of AFFINITY_COLUMNS, in column order

    @property
    def device_labels(self) -> tuple[str, ...]:
        return (*(f"GPU{i}" for i in range(self.gpu_count)), *self.nic_labels)


@dataclass(frozen=True, slots=True)
class Cell:
    """One link cell. `kind` is None on the diagonal (`X`); `guessed` marks an unknown code."""

    raw: str
    kind: LinkKind | None
    nvlinks: int = 0
    guessed: bool = False


def clean_lines(text: str, warnings: list[str]) -> list[Line]:
    """Numbered lines with CR and terminal escapes removed; rejects empty and binary input."""
    if not text.strip():
        raise TopologyParseError(1, "empty input: expected the output of `nvidia-smi topo -m`")
    lines: list[Line] = []
    stripped_escapes: list[int] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        _reject_binary(number, line)
        cleaned = _ANSI_RE.sub("", line)
        if cleaned != line:
            stripped_escapes.append(number)
        lines.append(Line(number, cleaned))
    if stripped_escapes:
        where = ", ".join(str(n) for n in stripped_escapes[:5])
        warnings.append(f"removed terminal escape codes (e.g. '[4m', '[0m') from line(s) {where}")
    return lines


def _reject_binary(number: int, line: str) -> None:
    for char in line:
        if char in "\t\x1b":
            continue
        if char == "\ufffd" or (ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0):
            raise TopologyParseError(
                number, f"binary data (character {ord(char):#04x}); this is not `nvidia-smi topo -m` text"
            )


def parse_header(line: Line, warnings: list[str]) -> Header:
    """Column names from the header line: GPUs, then NICs, then affinity columns."""
    text = line.text
    match = _AFFINITY_RE.search(text)
    device_part = text[: match.start()] if match else text
    affinity_part = text[match.start() :] if match else ""
    affinity = tuple(" ".join(name.split()) for name in _AFFINITY_RE.findall(affinity_part))
    leftover = _AFFINITY_RE.sub(" ", affinity_part).split()
    if leftover:
        raise TopologyParseError(line.number, f"unknown header column(s) after the devices: {leftover}")
    if len(set(affinity)) != len(affinity):
        raise TopologyParseError(line.number, f"repeated affinity column in the header: {list(affinity)}")

    labels: list[str] = []
    merged: list[str] = []
    for token in device_part.split():
        pieces = [p for p in _DEVICE_SPLIT_RE.split(token) if p]
        if len(pieces) > 1:
            merged.append(token)
        labels.extend(pieces)
    if merged:
        warnings.append(
            f"line {line.number}: header cells ran together ({', '.join(merged)}); split into {len(labels)} columns"
        )
    return _header_from_labels(line.number, labels, affinity)


def _header_from_labels(number: int, labels: list[str], affinity: tuple[str, ...]) -> Header:
    if not labels or labels[0] != "GPU0":
        found = labels[0] if labels else "nothing"
        raise TopologyParseError(number, f"expected a header starting with column GPU0, found {found!r}")
    gpu_count = 0
    while gpu_count < len(labels) and _GPU_LABEL_RE.match(labels[gpu_count]):
        if labels[gpu_count] != f"GPU{gpu_count}":
            raise TopologyParseError(
                number,
                f"GPU columns must run GPU0, GPU1, ...; found {labels[gpu_count]} at position {gpu_count}",
            )
        gpu_count += 1
    nic_labels = tuple(labels[gpu_count:])
    for label in nic_labels:
        if not (_NIC_ALIAS_RE.match(label) or _RAW_NIC_RE.match(label)):
            raise TopologyParseError(
                number, f"header column {label!r} is neither a GPU, a NIC nor an affinity column"
            )
    if len(set(nic_labels)) != len(nic_labels):
        raise TopologyParseError(number, f"repeated NIC column in the header: {list(nic_labels)}")
    return Header(gpu_count, nic_labels, affinity)


def split_row_label(line: Line, known: tuple[str, ...], warnings: list[str]) -> tuple[str, list[str]]:
    """The row label and the remaining tokens; separates a label glued to its first cell."""
    tokens = line.text.split()
    first = tokens[0]
    candidates = [label for label in known if first.startswith(label)]
    if not candidates:
        raise TopologyParseError(
            line.number, f"row label {first!r} is not a column of the header {list(known)}"
        )
    label = max(candidates, key=len)
    rest = tokens[1:]
    if first != label:
        warnings.append(
            f"line {line.number}: row label ran into its first cell ({first!r}); split after {label}"
        )
        rest = [first[len(label) :], *rest]
    return label, rest


def split_merged_codes(line: Line, tokens: list[str], warnings: list[str]) -> list[str]:
    """Tokens with run-together legend codes (`PXBNODE`) split apart."""
    result: list[str] = []
    for token in tokens:
        if not is_known_code(token) and _is_code_run(token):
            pieces = _CODE_RE.findall(token)
            warnings.append(f"line {line.number}: cells ran together ({token!r}); read as {' '.join(pieces)}")
            result.extend(pieces)
        else:
            result.append(token)
    return result


def _is_code_run(token: str) -> bool:
    return _CODE_RUN_RE.fullmatch(token) is not None


def is_known_code(token: str) -> bool:
    return token == "X" or token in _FIXED_CODES or _NV_RE.match(token) is not None


def is_code_shaped(token: str) -> bool:
    """Looks like a legend code (known or not), as opposed to a cpulist, a number or N/A."""
    return is_known_code(token) or _CODE_SHAPED_RE.match(token) is not None


def read_cell(token: str) -> Cell:
    """One code-shaped token as a link; unknown codes become a guessed SYS (the farthest level)."""
    if token == "X":
        return Cell(token, None)
    if token in _FIXED_CODES:
        return Cell(token, _FIXED_CODES[token])
    nv = _NV_RE.match(token)
    if nv and int(nv.group(1)) > 0:
        return Cell(token, LinkKind.NV, int(nv.group(1)))
    return Cell(token, LinkKind.SYS, guessed=True)
