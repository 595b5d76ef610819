"""`nvidia-smi topo -m` parsing: every captured machine, each kind of damage, and every rejection."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology.catalog import topo_dir
from topology.model import LinkKind
from topology.smi_parser import ParseResult, TopologyParseError, looks_like_nvswitch, parse_topo_matrix

Pairs = dict[tuple[int, int], int]


def all_pairs(gpus: int, nvlinks: int) -> Pairs:
    return {pair: nvlinks for pair in combinations(range(gpus), 2)}


def mesh(spec: dict[int, dict[int, int]]) -> Pairs:
    """NVLink pairs written as {gpu: {higher peer: link count}}."""
    return {(a, b): count for a, peers in spec.items() for b, count in peers.items()}


@dataclass(frozen=True)
class Expected:
    """What a human reading the file sees: GPU count, NVLink pairs, NIC names, NUMA nodes, warnings."""

    gpus: int
    nvlinks: Pairs
    nics: tuple[str, ...]
    numa: tuple[int | None, ...]
    nvswitch: bool = False
    warnings: tuple[str, ...] = ()  # one substring per expected warning; () means no warnings


MLX = tuple(f"mlx5_{i}" for i in range(12))
NUMA_4_4 = (0, 0, 0, 0, 1, 1, 1, 1)
NO_NUMA_8 = (None,) * 8

# The hybrid cube meshes, read off the files row by row.
DGX1_V100_FLEETX = mesh(
    {0: {1: 2, 2: 2, 3: 1, 4: 1}, 1: {2: 1, 3: 1, 5: 2}, 2: {3: 2, 6: 1}, 3: {7: 2},
     4: {5: 2, 6: 2, 7: 1}, 5: {6: 1, 7: 1}, 6: {7: 2}}
)  # fmt: skip
AZURE_ND40RS = mesh(
    {0: {1: 2, 2: 1, 3: 2, 6: 1}, 1: {2: 2, 3: 1, 7: 1}, 2: {3: 1, 4: 2}, 3: {5: 2},
     4: {5: 1, 6: 1, 7: 2}, 5: {6: 2, 7: 1}, 6: {7: 2}}
)  # fmt: skip
PYTORCH_RPC_V100 = mesh(
    {0: {1: 2, 2: 1, 3: 2, 4: 1}, 1: {2: 2, 3: 1, 5: 1}, 2: {3: 1, 6: 2}, 3: {7: 2},
     4: {5: 2, 6: 1, 7: 2}, 5: {6: 2, 7: 1}, 6: {7: 1}}
)  # fmt: skip
DGX1_P100 = mesh(
    {0: {1: 1, 2: 1, 3: 1, 4: 1}, 1: {2: 1, 3: 1, 5: 1}, 2: {3: 1, 6: 1}, 3: {7: 1},
     4: {5: 1, 6: 1, 7: 1}, 5: {6: 1, 7: 1}, 6: {7: 1}}
)  # fmt: skip

FILES: dict[str, Expected] = {
    "hgx-b300-8gpu-9nic-ansi.txt": Expected(
        8, all_pairs(8, 18), (*(f"mlx5_{i}" for i in range(10, 18)), "mlx5_bond_0"), NUMA_4_4, True,
        warnings=("terminal escape",),
    ),
    "hgx-h200-8gpu-10nic.txt": Expected(8, all_pairs(8, 18), MLX[:10], NUMA_4_4, True),
    "hgx-h100-8gpu-no-nic.txt": Expected(8, all_pairs(8, 18), (), NUMA_4_4, True),
    "hpe-xd670-h100-8gpu-12nic.txt": Expected(8, all_pairs(8, 18), MLX[:12], NUMA_4_4, True),
    "hgx-h800-8gpu-11nic-kvm.txt": Expected(8, all_pairs(8, 8), MLX[:11], NUMA_4_4, True),
    "hgx-h20-8gpu-8nic.txt": Expected(8, all_pairs(8, 18), MLX[1:9], NUMA_4_4, True),
    "hgx-h20-3e-8gpu-2nic.txt": Expected(8, all_pairs(8, 18), MLX[:2], NUMA_4_4, True),
    "hgx-a100-sxm4-80gb-8gpu-8nic.txt": Expected(8, all_pairs(8, 12), MLX[:8], NUMA_4_4, True),
    "dgx-a100-40gb-8gpu-10nic-8numa.txt": Expected(8, all_pairs(8, 12), MLX[:10], (3, 3, 1, 1, 7, 7, 5, 5), True),
    "princeton-della-2xa100-sys-2nic.txt": Expected(2, {}, MLX[:2], (0, 1)),
    "dgx1-v100-8gpu-1nic-fleetx.txt": Expected(8, DGX1_V100_FLEETX, ("mlx5_0",), NO_NUMA_8),
    "azure-nd40rs-v2-8xv100-hybrid-cube-mesh.txt": Expected(8, AZURE_ND40RS, (), (0,) * 8),
    "v100-8gpu-hybrid-cube-mesh-pytorch-rpc-bench.txt": Expected(
        8, PYTORCH_RPC_V100, (), NO_NUMA_8, warnings=("indented",)
    ),
    "dgx1-p100-8gpu-4nic-oldlegend.txt": Expected(
        8, DGX1_P100, ("mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"), NO_NUMA_8, warnings=("header cells ran together",)
    ),
    "k40m-4gpu-mlx4-oldlegend.txt": Expected(4, {}, ("mlx4_0",), (None,) * 4),
    "pcie-8gpu-nv12-bridge-pairs.txt": Expected(8, {(0, 2): 12, (1, 3): 12, (4, 5): 12, (6, 7): 12}, (), NUMA_4_4),
    "a100-4gpu-nvlink-bridge-pairs-2nic.txt": Expected(4, {(0, 1): 12}, MLX[:2], (0, 0, 1, 1)),
    "a30-4gpu-nvlink-bridge-pairs-1nic.txt": Expected(4, {(0, 1): 4, (2, 3): 4}, ("mlx5_0",), (0, 0, 1, 1)),
    "rtx-a6000-8gpu-nvlink-bridge-pairs-2nic.txt": Expected(
        8, {(0, 1): 4, (2, 3): 4, (4, 5): 4, (6, 7): 4}, MLX[:2], NUMA_4_4
    ),
    "rtx4090-8gpu-all-sys-2nic-go-gpuallocator-17.txt": Expected(
        8, {}, ("NIC0", "NIC1"), NUMA_4_4, warnings=("no NIC Legend entry for NIC0, NIC1",)
    ),
    "pcie-8gpu-all-sys-unknown-model.txt": Expected(8, {}, (), NUMA_4_4),
    "rtx3090-8gpu-2socket-pcie.txt": Expected(8, {}, (), NUMA_4_4),
    "rtx5090-8gpu-2socket-pcie-2nic.txt": Expected(8, {}, MLX[:2], NUMA_4_4),
    "v100-pcie-4gpu-pix-phb.txt": Expected(4, {}, (), (0, 0, 0, 0)),
    "rtx5090-2gpu-phb.txt": Expected(2, {}, (), (0, 0)),
    "h100-pcie-1gpu-1nic-kvm.txt": Expected(1, {}, ("mlx5_0",), (0,)),
    "rtx-pro-6000-blackwell-1gpu.txt": Expected(1, {}, (), (0,)),
}  # fmt: skip


def parse_file(name: str, model: str = "", memory_mib: int = 0) -> ParseResult:
    return parse_topo_matrix((topo_dir() / name).read_text(), model=model, memory_mib=memory_mib)


def nvlink_pairs(result: ParseResult) -> Pairs:
    return {(lk.a, lk.b): lk.nvlinks for lk in result.topology.gpu_links if lk.kind is LinkKind.NV}


def test_the_table_covers_every_captured_file() -> None:
    """Every `.txt` in the shared topo folder has an entry in FILES, and nothing else does."""
    assert sorted(FILES) == sorted(p.name for p in Path(topo_dir()).glob("*.txt"))


@pytest.mark.parametrize("name", sorted(FILES), ids=lambda n: n.removesuffix(".txt"))
def test_captured_file_parses_to_what_the_file_shows(name: str) -> None:
    """Each real capture gives the GPU count, NVLink pairs, NICs, NUMA nodes and warnings in FILES."""
    expected = FILES[name]
    result = parse_file(name)
    topo = result.topology
    assert topo.gpu_count == expected.gpus
    assert nvlink_pairs(result) == expected.nvlinks
    assert tuple(nic.name for nic in topo.nics) == expected.nics
    assert tuple(g.numa_node for g in topo.gpus) == expected.numa
    assert topo.nvswitch is expected.nvswitch
    assert len(result.warnings) == len(expected.warnings), result.warnings
    for fragment, warning in zip(expected.warnings, result.warnings, strict=True):
        assert fragment in warning
    assert len(topo.gpu_links) == expected.gpus * (expected.gpus - 1) // 2
    assert len(topo.nic_links) == expected.gpus * len(expected.nics)
    assert topo.sources == (("links", "nvidia-smi topo -m"),)


# ----------------------------------------------------------------------------- named hardware


@pytest.fixture
def dgx_a100() -> ParseResult:
    return parse_file("dgx-a100-40gb-8gpu-10nic-8numa.txt", model="A100-SXM4-40GB", memory_mib=40960)


def test_dgx_a100_gpus_carry_affinity_model_and_memory(dgx_a100: ParseResult) -> None:
    """DGX A100: GPU0 sits on CPUs 48-63,176-191 (NUMA 3), GPU NUMA ID is N/A, model/memory are applied."""
    gpu0 = dgx_a100.topology.gpus[0]
    assert gpu0.cpu_affinity == "48-63,176-191"
    assert gpu0.gpu_numa_id is None
    assert gpu0.model == "A100-SXM4-40GB"
    assert gpu0.memory_mib == 40960
    assert gpu0.uuid == ""


def test_dgx_a100_nics_pair_with_gpu_pairs_at_pxb(dgx_a100: ParseResult) -> None:
    """DGX A100: NIC0/NIC1 are PXB to GPU0/GPU1 and SYS to GPU2; the storage NICs 8/9 are SYS to all GPUs."""
    kinds = {(nl.gpu, nl.nic): nl.kind for nl in dgx_a100.topology.nic_links}
    assert kinds[(0, 0)] is LinkKind.PXB
    assert kinds[(1, 1)] is LinkKind.PXB
    assert kinds[(2, 0)] is LinkKind.SYS
    assert {kinds[(g, n)] for g in range(8) for n in (8, 9)} == {LinkKind.SYS}


def test_k40m_old_soc_legend_reads_as_sys_and_phb_pairs() -> None:
    """4x K40m (SOC era): GPU0-1 and GPU2-3 are PHB, pairs across sockets are SOC, read as SYS."""
    topo = parse_file("k40m-4gpu-mlx4-oldlegend.txt").topology
    assert topo.link(0, 1).kind is LinkKind.PHB
    assert topo.link(0, 2).kind is LinkKind.SYS
    assert topo.gpus[2].cpu_affinity == "6-11"


def test_v100_pcie_pix_pairs_and_phb_across() -> None:
    """4x V100 PCIe: GPU0-1 and GPU2-3 share a switch (PIX), other pairs cross the host bridge (PHB)."""
    topo = parse_file("v100-pcie-4gpu-pix-phb.txt").topology
    assert topo.link(0, 1).kind is LinkKind.PIX
    assert topo.link(1, 2).kind is LinkKind.PHB


def test_dgx1_p100_keeps_unordered_nic_columns_in_column_order() -> None:
    """DGX-1 P100: NIC columns mlx5_0, mlx5_2, mlx5_1, mlx5_3 keep column order; mlx5_2 is PIX to GPU4."""
    topo = parse_file("dgx1-p100-8gpu-4nic-oldlegend.txt").topology
    kinds = {(nl.gpu, topo.nics[nl.nic].name): nl.kind for nl in topo.nic_links}
    assert kinds[(4, "mlx5_2")] is LinkKind.PIX
    assert kinds[(0, "mlx5_1")] is LinkKind.PHB


# ----------------------------------------------------------------------------- layouts and damage


def tabbed(*rows: str) -> str:
    """Rows written with `|` for tabs, to keep the inline matrices readable."""
    return "\n".join(row.replace("|", "\t") for row in rows) + "\n"


TWO_GPU_ONE_NIC = tabbed(
    "|GPU0|GPU1|NIC0|CPU Affinity|NUMA Affinity|GPU NUMA ID",
    "GPU0| X |NV4|PIX|0-7|0||N/A",
    "GPU1|NV4| X |PHB|0-7|0||N/A",
    "NIC0|PIX|PHB| X |||",
    "",
    "NIC Legend:",
    "",
    "  NIC0: mlx5_bond_0",
)


def test_clean_two_gpu_matrix_has_no_warnings() -> None:
    """A well-formed tab matrix with empty trailing NIC cells and the driver's blank cell parses silently."""
    result = parse_topo_matrix(TWO_GPU_ONE_NIC)
    assert result.warnings == ()
    assert result.topology.link(0, 1).nvlinks == 4
    assert result.topology.nics[0].name == "mlx5_bond_0"
    assert result.topology.warnings == ()


def test_real_ansi_escapes_are_removed_with_a_warning() -> None:
    """Header wrapped in real ESC[4m ... ESC[0m underline parses like the clean one, with a warning."""
    text = TWO_GPU_ONE_NIC.replace("\tGPU0", "\t\x1b[4mGPU0", 1).replace(
        "GPU NUMA ID", "GPU NUMA ID\x1b[0m", 1
    )
    result = parse_topo_matrix(text)
    assert result.topology == parse_topo_matrix(TWO_GPU_ONE_NIC).topology
    assert any("escape" in w for w in result.warnings)


def test_run_together_link_cells_are_split() -> None:
    """A row whose tab was lost between PXB and NODE (`PXBNODE`) is split back into two cells."""
    text = tabbed("|GPU0|GPU1|GPU2", "GPU0| X |PXB|NODE", "GPU1|PXB| X |NODE", "GPU2|NODE|NODE| X ").replace(
        "GPU0\t X \tPXB\tNODE", "GPU0\t X \tPXBNODE"
    )
    result = parse_topo_matrix(text)
    assert result.topology.link(0, 1).kind is LinkKind.PXB
    assert result.topology.link(0, 2).kind is LinkKind.NODE
    assert any("PXBNODE" in w for w in result.warnings)


def test_run_together_header_cells_are_split() -> None:
    """A header `GPU0GPU1mlx5_0` (tabs lost) is split into GPU0, GPU1, mlx5_0 with a warning."""
    text = tabbed(
        "|GPU0GPU1mlx5_0|CPU Affinity", "GPU0| X |NV2|PIX|0-3", "GPU1|NV2| X |PIX|0-3", "mlx5_0|PIX|PIX| X"
    )
    result = parse_topo_matrix(text)
    assert result.topology.gpu_count == 2
    assert result.topology.nics[0].name == "mlx5_0"
    assert any("ran together" in w for w in result.warnings)


def test_row_label_glued_to_first_cell_is_separated() -> None:
    """`GPU1NV2` (label and first cell run together) is read as label GPU1, cell NV2."""
    text = tabbed("|GPU0|GPU1", "GPU0| X |NV2", "GPU1NV2| X ")
    result = parse_topo_matrix(text)
    assert result.topology.link(0, 1).nvlinks == 2
    assert any("row label ran into" in w for w in result.warnings)


def test_space_aligned_indented_layout_with_split_two_word_header() -> None:
    """Markdown-indented, space-aligned rows and a `CPU     Affinity` header read fine, noting the indent."""
    text = "\n".join(
        [
            "    GPU0    GPU1    CPU     Affinity",
            "    GPU0     X      NV1    0-19,40-59",
            "    GPU1    NV1      X     0-19,40-59",
        ]
    )
    result = parse_topo_matrix(text)
    assert result.topology.gpus[1].cpu_affinity == "0-19,40-59"
    assert [w for w in result.warnings if "indented" in w]


def test_unpadded_x_and_trailing_padded_x_are_both_accepted() -> None:
    """`X` without spaces on the diagonal, and a last cell ` X ` with trailing spaces, are plain layout."""
    text = "        GPU0    GPU1\nGPU0    X       SYS\nGPU1    SYS      X \n"
    result = parse_topo_matrix(text)
    assert result.warnings == ()
    assert result.topology.link(0, 1).kind is LinkKind.SYS


def test_unknown_code_is_read_as_sys_with_a_warning() -> None:
    """A code the legend never had (`QPX` on both sides) is taken as SYS, the farthest level, and reported."""
    text = tabbed("|GPU0|GPU1", "GPU0| X |QPX", "GPU1|QPX| X ")
    result = parse_topo_matrix(text)
    assert result.topology.link(0, 1).kind is LinkKind.SYS
    assert any("unknown link code 'QPX'" in w for w in result.warnings)


def test_unknown_code_on_one_side_takes_the_other_side() -> None:
    """When only GPU1's row has the unknown code, GPU0's row (NV2) is used, with a warning."""
    text = tabbed("|GPU0|GPU1", "GPU0| X |NV2", "GPU1|ZZZ| X ")
    result = parse_topo_matrix(text)
    assert result.topology.link(0, 1).nvlinks == 2
    assert any("used 'NV2' from the other side" in w for w in result.warnings)


def test_old_psb_code_reads_as_pix() -> None:
    """The intermediate-era `PSB` (single on-board PCIe switch) is read as PIX."""
    text = tabbed("|GPU0|GPU1", "GPU0| X |PSB", "GPU1|PSB| X ")
    assert parse_topo_matrix(text).topology.link(0, 1).kind is LinkKind.PIX


def test_grace_style_affinity_lists_and_gpu_numa_id() -> None:
    """A NUMA Affinity list (`1,13-19`) gives no single NUMA node; GPU NUMA ID 12 is kept as a number."""
    text = tabbed(
        "|GPU0|GPU1|CPU Affinity|NUMA Affinity|GPU NUMA ID",
        "GPU0| X |NV6|72-143|1,13-19||12",
        "GPU1|NV6| X |72-143|1,13-19||20",
    )
    gpus = parse_topo_matrix(text).topology.gpus
    assert gpus[0].numa_node is None
    assert (gpus[0].gpu_numa_id, gpus[1].gpu_numa_id) == (12, 20)


def test_missing_affinity_values_leave_affinity_unknown() -> None:
    """A row with fewer affinity values than columns is not guessed at: its affinity stays unknown."""
    text = tabbed("|GPU0|GPU1|CPU Affinity|NUMA Affinity", "GPU0| X |SYS|0-7|0", "GPU1|SYS| X |8-15")
    result = parse_topo_matrix(text)
    assert result.topology.gpus[1].numa_node is None
    assert result.topology.gpus[1].cpu_affinity == ""
    assert any("left unknown" in w for w in result.warnings)


def test_missing_nic_rows_are_reported() -> None:
    """A header NIC column without a NIC row still yields GPU↔NIC links from the GPU rows, with a warning."""
    text = tabbed("|GPU0|GPU1|mlx5_0", "GPU0| X |SYS|PIX", "GPU1|SYS| X |SYS")
    result = parse_topo_matrix(text)
    assert result.topology.nic_links[0].kind is LinkKind.PIX
    assert any("no rows for NIC column" in w for w in result.warnings)


# ----------------------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    ("text", "line_no", "fragment"),
    [
        ("", 1, "empty input"),
        ("   \n\t\n", 1, "empty input"),
        ("\x7fELF\x02\x01\x01\x00\x00", 1, "binary data"),
        ("|GPU0|GPU1\nGPU0| X |NV1\nGPU1|NV2| X \n", 3, "asymmetric matrix: GPU0→GPU1 is NV1"),
        ("|GPU0|GPU1|GPU2\nGPU0| X |SYS|SYS\nGPU1|SYS| X |SYS\n", 1, "3 GPUs but there are 2 GPU rows"),
        ("|GPU0|GPU1\n\nLegend:\n", 2, "no GPU rows"),
        ("Legend:\n  X = Self\n", 1, "header starting with column GPU0"),
        ("|GPU1|GPU0\nGPU1| X |SYS\n", 1, "header starting with column GPU0"),
        ("|GPU0|GPU2\nGPU0| X |SYS\n", 1, "found GPU2 at position 1"),
        ("|GPU0|GPU1\nGPU0| X |SYS\nGPU7|SYS| X \n", 3, "row label 'GPU7' is not a column"),
        ("|GPU0|GPU1\nGPU0| X \nGPU1|SYS| X \n", 2, "row GPU0 has 1 link cells but the header has 2"),
        ("|GPU0|GPU1\nGPU0| X |SYS|SYS\nGPU1|SYS| X \n", 2, "row GPU0 has 3 link cells"),
        ("|GPU0|GPU1\nGPU0|SYS|SYS\nGPU1|SYS| X \n", 2, "column GPU0: expected X, found 'SYS'"),
        ("|GPU0|GPU1\nGPU0| X | X \nGPU1|SYS| X \n", 2, "column GPU1: expected a link code"),
        ("|GPU0|GPU1\nGPU0| X |SYS\nGPU0| X |SYS\n", 3, "row GPU0 appears twice"),
        ("|GPU0|CPU Affinity\nGPU0| X |all\n", 2, "is not a CPU list"),
        ("|GPU0|CPU Affinity\nGPU0| X |0-3|9\n", 2, "1 affinity column"),
        ("|GPU0|GPU NUMA ID\nGPU0| X |node1\n", 2, "GPU NUMA ID 'node1' is not a number"),
        ("|GPU0|Bandwidth\nGPU0| X \n", 1, "neither a GPU, a NIC nor an affinity column"),
        ("|GPU0|GPU1|NIC0\nGPU0| X |SYS|PIX\nGPU1|SYS| X |SYS\nNIC0|SYS|SYS| X \n", 4, "asymmetric"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 and "\n" not in v else None,
)
def test_unreadable_input_is_rejected_with_line_and_reason(text: str, line_no: int, fragment: str) -> None:
    """Each unrecoverable fault raises TopologyParseError naming the line and what was wrong."""
    with pytest.raises(TopologyParseError) as caught:
        parse_topo_matrix(text.replace("|", "\t"))
    assert caught.value.line_no == line_no
    assert fragment in caught.value.message


def test_error_message_names_line_and_both_sides_of_an_asymmetry() -> None:
    """The error reads `line N: ...`, is a ValueError, and quotes both mismatching cells."""
    text = tabbed("|GPU0|GPU1|GPU2", "GPU0| X |NV2|SYS", "GPU1|NV2| X |SYS", "GPU2|NODE|SYS| X ")
    with pytest.raises(ValueError, match="asymmetric") as caught:
        parse_topo_matrix(text)
    assert str(caught.value) == ("line 4: asymmetric matrix: GPU0→GPU2 is SYS (line 2) but GPU2→GPU0 is NODE")


def test_replacement_characters_from_bad_bytes_are_binary_junk() -> None:
    """Bytes decoded with errors='replace' (U+FFFD) are rejected rather than read as cells."""
    text = b"\tGPU0\nGPU0\t X \xff\xfe\n".decode("utf-8", errors="replace")
    with pytest.raises(TopologyParseError, match="line 2: binary data"):
        parse_topo_matrix(text)


# ----------------------------------------------------------------------------- NVSwitch heuristic


def nv_matrix(gpus: int, nvlinks: int) -> str:
    header = "\t" + "\t".join(f"GPU{i}" for i in range(gpus))
    rows = [
        f"GPU{i}\t" + "\t".join(" X " if i == j else f"NV{nvlinks}" for j in range(gpus)) for i in range(gpus)
    ]
    return "\n".join([header, *rows])


@pytest.mark.parametrize(
    ("gpus", "nvlinks", "switched"),
    [
        (8, 12, True),  # DGX/HGX A100
        (8, 18, True),  # HGX H100/H200/B300
        (8, 8, True),  # HGX H800
        (16, 6, True),  # DGX-2
        (4, 18, True),  # a 4-GPU tray on an NVLink switch
        (4, 6, False),  # 4x H100 / GH200 direct mesh: 3 x 6 = 18 links
        (4, 4, False),  # 4x A100 HGX direct mesh
        (4, 2, False),  # DGX Station V100
        (2, 12, False),  # a bridged pair
    ],
)
def test_nvswitch_is_inferred_only_when_a_direct_mesh_is_impossible(
    gpus: int, nvlinks: int, switched: bool
) -> None:
    """Uniform all-to-all NV<c> on n>=4 GPUs means NVSwitch only when c*(n-1) exceeds 18 links per GPU."""
    assert parse_topo_matrix(nv_matrix(gpus, nvlinks)).topology.nvswitch is switched


def test_nvswitch_needs_every_pair_linked() -> None:
    """An incomplete link list is never called switched."""
    assert looks_like_nvswitch((), 8) is False


# ----------------------------------------------------------------------------- property


@st.composite
def matrices(draw: st.DrawFn) -> tuple[str, dict[tuple[int, int], str]]:
    gpus = draw(st.integers(1, 6))
    codes = st.sampled_from(["SYS", "NODE", "PHB", "PXB", "PIX", "NV1", "NV2", "NV12", "NV18"])
    cells = {pair: draw(codes) for pair in combinations(range(gpus), 2)}
    sep = draw(st.sampled_from(["\t", "    ", "\t\t"]))
    header = sep + sep.join(f"GPU{i}" for i in range(gpus)) + sep + "CPU Affinity"
    rows = []
    for i in range(gpus):
        row = [" X " if i == j else cells[(min(i, j), max(i, j))] for j in range(gpus)]
        rows.append(f"GPU{i}{sep}" + sep.join(row) + f"{sep}{i * 4}-{i * 4 + 3}")
    return "\n".join([header, *rows]), cells


@settings(max_examples=60, deadline=None)
@given(matrices())
def test_any_symmetric_matrix_round_trips_through_the_parser(
    case: tuple[str, dict[tuple[int, int], str]],
) -> None:
    """Whatever symmetric matrix is printed, tabbed or spaced, the parser reads back the same cells."""
    text, cells = case
    topo = parse_topo_matrix(text).topology
    for (a, b), code in cells.items():
        link = topo.link(a, b)
        assert (link.kind.value if link.nvlinks == 0 else f"NV{link.nvlinks}") == code
    assert all(g.cpu_affinity == f"{g.index * 4}-{g.index * 4 + 3}" for g in topo.gpus)
