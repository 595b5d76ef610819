"""The machine catalog: every profile loads, ids are synthetic but stable, the shared folder is found."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from topology.catalog import (
    MACHINES,
    PACKAGED_DIR,
    SHARED_ENV,
    CatalogError,
    load_machine,
    machine_names,
    shared_dir,
    synthetic_dgx2,
    synthetic_uuid,
    topo_dir,
)
from topology.model import LinkKind

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_profile_loads_with_its_model_memory_and_ids(name: str) -> None:
    """Each catalog machine parses, carries the profile's model/memory, and has unique synthetic ids."""
    profile = MACHINES[name]
    topo = load_machine(name)
    assert topo.gpu_count >= 1
    assert {g.model for g in topo.gpus} == {profile.model}
    assert {g.memory_mib for g in topo.gpus} == {profile.memory_mib}
    assert all(UUID_RE.match(g.uuid) for g in topo.gpus)
    assert len({g.uuid for g in topo.gpus}) == topo.gpu_count
    assert [g.pci_bus_id for g in topo.gpus] == sorted({g.pci_bus_id for g in topo.gpus})


def test_every_profile_file_exists_in_the_shared_folder() -> None:
    """Profiles point at files that are really there."""
    assert all((topo_dir() / p.file).is_file() for p in MACHINES.values())


def test_named_machines_from_the_brief_are_present() -> None:
    """The short names other code relies on exist, with the stated model and memory for the two anchors."""
    for name in ("dgx-a100", "hgx-h100", "dgx1-v100", "azure-nd40rs-v2", "pcie-nv12-pairs", "rtx-a6000-pairs",
                 "rtx4090-all-sys", "rtx3090-2socket", "v100-pcie-pix-phb", "a30-pairs", "hgx-h800",
                 "hgx-h200", "hgx-b300", "dgx2"):  # fmt: skip
        assert name in machine_names()
    assert (MACHINES["dgx-a100"].model, MACHINES["dgx-a100"].memory_mib) == ("A100-SXM4-40GB", 40960)
    assert (MACHINES["hgx-h100"].model, MACHINES["hgx-h100"].memory_mib) == ("H100 80GB HBM3", 81559)


def test_uuids_are_deterministic_per_machine_and_index() -> None:
    """Loading twice gives the same UUIDs; two machines never share one."""
    assert load_machine("hgx-h100").gpus[3].uuid == load_machine("hgx-h100").gpus[3].uuid
    assert synthetic_uuid("hgx-h100", 0) != synthetic_uuid("hgx-h200", 0)


def test_a_path_loads_like_a_profile_without_model() -> None:
    """A path to a topo file loads too; the model is unknown and UUIDs are keyed by the file stem."""
    path = topo_dir() / "rtx3090-8gpu-2socket-pcie.txt"
    topo = load_machine(path)
    assert topo.gpus[0].model == ""
    assert topo.gpus[0].uuid == synthetic_uuid(path.stem, 0)
    assert topo.link(0, 4).kind is LinkKind.SYS


def test_unknown_name_is_a_catalog_error_listing_known_names() -> None:
    """A name that is neither a profile nor a path raises CatalogError (a ValueError), not KeyError."""
    with pytest.raises(CatalogError, match=r"unknown machine 'dgx-9000'.*dgx-a100"):
        load_machine("dgx-9000")


def test_missing_and_unparsable_files_are_catalog_errors(tmp_path: Path) -> None:
    """A missing file and a damaged file both raise CatalogError with the reason."""
    with pytest.raises(CatalogError, match="cannot read topology file"):
        load_machine(tmp_path / "absent.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV2\t X \n")
    with pytest.raises(CatalogError, match=r"bad\.txt: line 3: asymmetric"):
        load_machine(bad)


def test_shared_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """LINKPACK_SHARED overrides the default `shared` folder next to the repository."""
    monkeypatch.setenv("LINKPACK_SHARED", str(tmp_path))
    assert shared_dir() == tmp_path
    monkeypatch.delenv("LINKPACK_SHARED")
    assert shared_dir().name == "shared"


def test_synthetic_dgx2_is_sixteen_v100s_on_nvswitch() -> None:
    """DGX-2: 16 V100-32GB, NV6 between every pair, NVSwitch, GPUs 0-7 on NUMA 0 and 8-15 on NUMA 1."""
    dgx2 = synthetic_dgx2()
    assert dgx2.gpu_count == 16 and dgx2.nvswitch
    assert {(lk.kind, lk.nvlinks) for lk in dgx2.gpu_links} == {(LinkKind.NV, 6)}
    assert len(dgx2.gpu_links) == 120
    assert [g.numa_node for g in dgx2.gpus] == [0] * 8 + [1] * 8
    assert load_machine("dgx2") == dgx2


def test_the_packaged_captures_are_the_shared_ones_byte_for_byte() -> None:
    """Each `topo -m` file shipped in the package is a catalog machine's, identical to its capture
    in the shared data folder."""
    packaged = sorted(p.name for p in PACKAGED_DIR.glob("*.txt"))
    assert packaged, "the demo's machines ship with the package"
    assert set(packaged) <= {m.file for m in MACHINES.values()}
    for name in packaged:
        assert (PACKAGED_DIR / name).read_bytes() == (topo_dir() / name).read_bytes(), name


def test_without_a_shared_folder_the_packaged_machines_load_and_the_others_say_where_to_look(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the shared folder absent, every machine whose capture ships loads as it does with the
    folder; any other names its file and the variable to set, without a traceback's worth of noise."""
    shipped = [m for m in sorted(MACHINES) if (PACKAGED_DIR / MACHINES[m].file).is_file()]
    with_shared = {m: load_machine(m) for m in shipped}
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "absent"))
    for name in shipped:
        assert load_machine(name) == with_shared[name]
    other = next(m for m in sorted(MACHINES) if m not in shipped)
    with pytest.raises(CatalogError, match=rf"{MACHINES[other].file} is not in this package.*{SHARED_ENV}"):
        load_machine(other)
