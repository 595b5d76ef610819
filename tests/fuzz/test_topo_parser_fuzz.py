"""Fuzz `topology.smi_parser.parse_topo_matrix`: it never hangs, never lets anything but its own
TopologyParseError escape, and that error names a line of the input.

Each input is parsed in a sandbox process (`tests.fuzz.sandbox`) with a memory limit and a
deadline, so a hang or a memory blow-up fails the example instead of the run. Inputs: synthetic
captures shaped like real ones (which must parse to exactly the matrix they print), mutations of
the real captures in `<shared>/data/topo/` and of the corpus seeds, and random text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.fuzz.corpus_support import entry_paths, expectation, read_text, replay_params
from tests.fuzz.fuzz_settings import fuzz
from tests.fuzz.known_bugs import known_bug
from tests.fuzz.sandbox import Sandbox
from tests.fuzz.topo_support import AFFINITY, ParserContractError, Shape, check_parser, real_captures, render

TARGET = "topo"
_SANDBOX: Sandbox | None = None


@pytest.fixture(scope="module", autouse=True)
def _sandbox() -> Iterator[None]:
    global _SANDBOX
    with Sandbox() as sandbox:
        _SANDBOX = sandbox
        try:
            yield
        finally:
            _SANDBOX = None


def parse(text: str, timeout_s: float = 5.0) -> dict[str, object] | None:
    assert _SANDBOX is not None
    return check_parser(_SANDBOX, text, timeout_s)


def parse_tolerating_known_bugs(text: str) -> dict[str, object] | None:
    """`parse`, except that a failure listed in known_bugs.py is counted, not raised."""
    try:
        return parse(text)
    except ParserContractError as exc:
        escaped = exc.kind.removeprefix("escaped ")
        bug = known_bug(TARGET, escaped, str(exc))
        if bug is None:
            raise
        event(f"known bug: {bug.corpus}")
        return None


# ---------------------------------------------------------------------- strategies

_RAW_NICS = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_11", "mlx4_0", "mlx5_bond_0", "ib0", "bnxt_re0")


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    gpus = draw(st.integers(1, 8) | st.just(16))
    nics = draw(st.integers(0, 4))
    soc = draw(st.booleans())
    pcie = ["SOC", "PHB", "PXB", "PIX"] if soc else ["SYS", "NODE", "PHB", "PXB", "PIX", "PSB"]
    size = gpus + nics
    codes = [["X"] * size for _ in range(size)]
    for i in range(size):
        for j in range(i + 1, size):
            if j < gpus and draw(st.booleans()):
                code = f"NV{draw(st.integers(1, 18))}"
            else:
                code = draw(st.sampled_from(pcie))
            codes[i][j] = codes[j][i] = code
    aliases = draw(st.booleans())
    names = tuple(draw(st.lists(st.sampled_from(_RAW_NICS), min_size=nics, max_size=nics, unique=True)))
    affinity = tuple(column for column in AFFINITY if draw(st.booleans()))
    cpus = st.sampled_from(["0-15", "0-63,128-191", "64-127,192-255", "0,2,4", "N/A", "7"])
    numa = st.sampled_from(["0", "1", "3", "0-1", "N/A"])
    gpu_numa = st.sampled_from(["N/A", "0", "12"])
    by_column = {"CPU Affinity": cpus, "NUMA Affinity": numa, "GPU NUMA ID": gpu_numa}
    values = tuple(tuple(draw(by_column[c]) for c in affinity) for _ in range(gpus))
    return Shape(
        gpus,
        names,
        tuple(tuple(row) for row in codes),
        affinity,
        values,
        nic_aliases=aliases,
        soc_legend=soc,
        tabs=draw(st.booleans()),
        centred_x=draw(st.booleans()),
        nic_trailing_cells=draw(st.booleans()),
        blank_before_gpu_numa_id=draw(st.booleans()),
        legend=draw(st.booleans()),
    )


def _bases() -> list[str]:
    captures = list(real_captures().values())
    seeds = [read_text(p) for p in entry_paths(TARGET) if expectation(p) == "ok"]
    return captures + seeds


BASES = _bases()
_ODD = [
    "\t", " ", "\n", "\r", "X", "NV", "NV18", "SYS", "NODE", "PIX", "N/A", "-", ",", "0", "9",
    "\u00b2", "\u0663", "\uff11", "\u00a0", "\u2003", "\u200b", "\u2028", "\ufeff", "\u00e9", "\U0001f600",
    "\x00", "\x07", "\x1b", "\x7f", "\x85", "\ufffd", "GPU", "GPU0", "NIC", "mlx5_", "Legend:",
]  # fmt: skip
_ANSI = ["\x1b[4m", "\x1b[0m", "[4m", "[0m", "\x1b[1;31m", "\x1b[m", "\x1b[38;5;196m", "\x1b]0;t\x07"]
_TOKENS = [
    "GPU0", "GPU1", "GPU2", "GPU7", "NIC0", "NIC1", "mlx5_0", "X", " X ", "NV1", "NV12", "NV18", "NV0",
    "SYS", "SOC", "NODE", "PHB", "PXB", "PIX", "PSB", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID",
    "0-63,128-191", "0", "1", "N/A", "Legend:", "NIC Legend:", "NIC0: mlx5_0", "PXBNODE", "GPU0NV12",
]  # fmt: skip
MUTATIONS = (
    "flip_char",
    "flip_bit",
    "truncate",
    "delete_span",
    "duplicate_line",
    "drop_line",
    "swap_lines",
    "swap_columns",
    "huge_line",
    "huge_token",
    "insert_unicode",
    "insert_ansi",
    "crlf",
    "tabs_to_spaces",
    "replace_token",
    "grow_number",
    "interesting_value",
)
#: Values that break parsers of numbers and lists: huge, negative, non-ASCII digits, empty.
_INTERESTING = [
    "0-4294967295", "0-99999999999", "4294967296", "-1", "0--1", "1-0", "0,,1", ",", "", "N/A", "NA",
    "\u00b2", "\u0663", "\uff11", "NV0", "NV" + "9" * 30, "NV-1", "X X", "GPU0", "0x10", "1e3",
]  # fmt: skip


def _mutate(text: str, op: str, draw: st.DrawFn) -> str:
    position = draw(st.integers(0, len(text)))
    lines = text.split("\n")
    line = draw(st.integers(0, max(0, len(lines) - 1)))
    if op == "flip_char" and text:
        at = min(position, len(text) - 1)
        return text[:at] + draw(st.sampled_from(_ODD) | st.characters()) + text[at + 1 :]
    if op == "flip_bit" and text:
        data = bytearray(text.encode("utf-8", errors="surrogatepass"))
        at = draw(st.integers(0, len(data) - 1))
        data[at] ^= 1 << draw(st.integers(0, 7))
        return data.decode("utf-8", errors="replace")
    if op == "truncate":
        return text[:position]
    if op == "delete_span":
        return text[:position] + text[position + draw(st.integers(1, 200)) :]
    if op == "duplicate_line":
        return "\n".join([*lines[: line + 1], lines[line], *lines[line + 1 :]])
    if op == "drop_line":
        return "\n".join(lines[:line] + lines[line + 1 :])
    if op == "swap_lines":
        other = draw(st.integers(0, max(0, len(lines) - 1)))
        lines[line], lines[other] = lines[other], lines[line]
        return "\n".join(lines)
    if op == "swap_columns":  # the same two columns of every row swapped (a shuffled matrix)
        first, second = draw(st.integers(0, 24)), draw(st.integers(0, 24))
        out = []
        for row in lines:
            cells = row.split("\t") if "\t" in row else row.split(" ")
            if max(first, second) < len(cells):
                cells[first], cells[second] = cells[second], cells[first]
            out.append(("\t" if "\t" in row else " ").join(cells))
        return "\n".join(out)
    if op == "huge_line":
        token = draw(st.sampled_from(_TOKENS))
        lines.insert(line, "\t".join([token] * draw(st.integers(1_000, 20_000))))
        return "\n".join(lines)
    if op == "huge_token":  # a long run of digits or letters inside a cell
        run = draw(st.sampled_from(["9", "1", "A", "0-"])) * draw(st.integers(50, 6_000))
        return text[:position] + run + text[position:]
    if op == "insert_unicode":
        return text[:position] + draw(st.text(min_size=1, max_size=8)) + text[position:]
    if op == "insert_ansi":
        return text[:position] + draw(st.sampled_from(_ANSI)) + text[position:]
    if op == "crlf":
        return text.replace("\n", "\r\n")
    if op == "tabs_to_spaces":
        return text.replace("\t", " " * draw(st.integers(1, 4)))
    if op in ("replace_token", "interesting_value") and text:
        tokens = text.split("\t")
        at = draw(st.integers(0, len(tokens) - 1))
        tokens[at] = draw(st.sampled_from(_TOKENS + _ODD if op == "replace_token" else _INTERESTING))
        return "\t".join(tokens)
    if op == "grow_number":  # a number of the text made huge: NV counts, cpulists, NUMA ids
        numbers = list(re.finditer(r"\d+", text))
        if not numbers:
            return text
        found = numbers[draw(st.integers(0, len(numbers) - 1))]
        digits = found.group()
        grown = draw(
            st.sampled_from([digits + digits[-1] * 12, "4294967295", digits[-1] * 5000, "1" + "0" * 400])
        )
        return text[: found.start()] + grown + text[found.end() :]
    return text


@st.composite
def mutated_captures(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(BASES) | shapes().map(render))
    for op in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)):
        text = _mutate(text, op, draw)
    return text


@st.composite
def random_texts(draw: st.DrawFn) -> str:
    lines = draw(
        st.lists(
            st.lists(
                st.sampled_from(_TOKENS) | st.sampled_from(_ODD + _ANSI) | st.text(max_size=6), max_size=24
            ),
            max_size=20,
        )
    )
    separator = draw(st.sampled_from(["\t", " ", "  ", "\t\t"]))
    return "\n".join(separator.join(cells) for cells in lines)


# ---------------------------------------------------------------------- properties


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(shapes())
def test_shapes_of_real_captures_parse_to_the_matrix_they_print(shape: Shape) -> None:
    """A capture rendered from a shape parses, without a repair, to that shape's GPUs, links and NICs."""
    parsed = parse(render(shape))
    assert parsed is not None
    expected = shape.expected()
    assert {key: parsed[key] for key in expected} == expected
    assert parsed["warnings"] == [], parsed["warnings"]


@pytest.mark.timeout(120)
@fuzz(max_examples=250)
@given(mutated_captures())
def test_mutated_captures_parse_or_are_refused_naming_a_line(text: str) -> None:
    """Byte flips, truncation, column shuffles, huge lines, unicode and ANSI codes in real captures."""
    parse_tolerating_known_bugs(text)


@pytest.mark.timeout(120)
@fuzz(max_examples=250)
@given(random_texts() | st.text(max_size=400))
def test_random_text_is_parsed_or_refused_naming_a_line(text: str) -> None:
    """Random lines of topo-like tokens and random unicode never hang the parser or escape it."""
    parse_tolerating_known_bugs(text)


# ---------------------------------------------------------------------- corpus and real captures


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params(TARGET, ParserContractError))
def test_corpus_entry(path: Path) -> None:
    """Each corpus entry keeps the parser's contract; ok- entries parse and err- entries are refused."""
    result = parse(read_text(path), timeout_s=10.0)
    if expectation(path) == "ok":
        assert result is not None, f"{path.name} was refused"
    elif expectation(path) == "err":
        assert result is None, f"{path.name} parsed: {result}"


@pytest.mark.timeout(120)
def test_real_captures_keep_the_contract() -> None:
    """Every real capture in the shared folder parses or is refused naming a line (the seeds of mutation)."""
    captures = real_captures()
    if not captures:
        pytest.skip("no real captures in $LINKPACK_SHARED/data/topo (or ../shared/data/topo)")
    parsed = [name for name, text in captures.items() if parse(text) is not None]
    assert len(parsed) >= len(captures) // 2, f"only {parsed} of {sorted(captures)} parsed"
