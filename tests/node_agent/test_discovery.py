"""Discovery merges NVML and `nvidia-smi topo -m` and says where each fact came from."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from node_agent.sources.discovery import (
    SOURCE_TOPO,
    DiscoveryError,
    NvmlReading,
    discover,
    links_from_nvml,
    merge,
    read_nvml,
)
from node_agent.sources.nvml_simulated import SimulatedNvml
from tests.support.machines import catalog_machine, topo_text
from topology.model import GpuLink, LinkKind, MigDevice, MigMode

SIM = "nvml (simulated)"


def _links(topology):
    return {(lk.a, lk.b): (lk.kind, lk.nvlinks) for lk in topology.gpu_links}


@pytest.mark.parametrize("name", ["dgx-a100", "hgx-h100", "dgx1-v100"])
def test_nvml_and_topo_agree_on_real_machines(name):
    """On every catalog machine NVML and `topo -m` agree, so discovery warns of nothing."""
    topo = catalog_machine(name)
    found = discover(SimulatedNvml(topo), topo_text(name))
    assert found.warnings == ()
    assert _links(found.topology) == _links(topo)
    assert found.topology.nvswitch == topo.nvswitch
    assert found.sources["identity"] == SIM
    assert found.sources["memory"] == SIM
    assert found.sources["mig"] == SIM
    assert found.sources["links"] == SIM
    assert dict(found.topology.sources) == dict(found.sources)
    assert all(g.uuid.startswith("GPU-") and g.pci_bus_id for g in found.topology.gpus)


def test_nics_come_from_topo_and_numa_from_nvml():
    """NICs come from `topo -m` and NUMA placement from NVML."""
    found = discover(SimulatedNvml(catalog_machine("dgx-a100")), topo_text("dgx-a100"))
    assert found.sources["nics"] == SOURCE_TOPO
    assert [n.name for n in found.topology.nics] == [f"mlx5_{i}" for i in range(10)]
    assert found.sources["numa"] == SIM
    assert [g.numa_node for g in found.topology.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert found.topology.nvswitch and found.sources["nvswitch"] == SIM


def test_nvml_alone_has_everything_but_nics():
    """NVML alone gives every fact except the NICs."""
    found = discover(SimulatedNvml(catalog_machine("dgx-a100")), None)
    assert found.topology.nics == ()
    assert "nics" not in found.sources
    assert set(found.sources.values()) == {SIM}


def test_topo_alone_is_used_when_there_is_no_nvml():
    """Without NVML, `topo -m` and the hints give the whole topology."""
    found = discover(None, topo_text("dgx1-v100"), model_hint="Tesla V100-SXM2-32GB", memory_hint_mib=32768)
    assert set(found.sources.values()) == {SOURCE_TOPO}
    assert _links(found.topology) == _links(catalog_machine("dgx1-v100"))
    assert found.topology.gpus[0].memory_mib == 32768
    assert found.topology.gpus[0].uuid == ""


def test_no_source_at_all_is_an_error():
    """Without NVML and without `topo -m`, discovery fails with a DiscoveryError."""
    with pytest.raises(DiscoveryError, match="no GPU information"):
        discover(None, None)


def test_when_sources_disagree_nvml_wins_and_a_warning_names_the_pair():
    """When the sources disagree on a link NVML wins and a warning names the GPU pair."""
    truth = catalog_machine("dgx1-v100")
    drifted = replace(
        truth,
        gpu_links=tuple(
            GpuLink(0, 1, LinkKind.NV, 1) if (lk.a, lk.b) == (0, 1) else lk for lk in truth.gpu_links
        ),
    )
    found = discover(SimulatedNvml(drifted), topo_text("dgx1-v100"))
    assert found.topology.link(0, 1).nvlinks == 1
    assert any(
        "GPU 0-GPU 1: NVML says NV1, nvidia-smi topo -m says NV2; using NVML" in w for w in found.warnings
    )
    assert found.topology.warnings == found.warnings


def test_gpu_count_mismatch_ignores_topo():
    """A `topo -m` matrix with another GPU count is ignored, with a warning."""
    topo = catalog_machine("hgx-h100")
    four = replace(topo, gpus=topo.gpus[:4], gpu_links=tuple(lk for lk in topo.gpu_links if lk.b < 4))
    found = discover(SimulatedNvml(four), topo_text("hgx-h100"))
    assert found.topology.gpu_count == 4
    assert any("lists 8 GPUs but NVML sees 4" in w for w in found.warnings)
    assert SOURCE_TOPO not in found.sources.values()


def test_garbage_topo_output_is_a_warning_not_a_failure():
    """Unparseable `topo -m` output is a warning, not a failure."""
    found = discover(SimulatedNvml(catalog_machine("hgx-h100")), "this is not a matrix\n")
    assert found.topology.gpu_count == 8
    assert any("output unusable" in w for w in found.warnings)


def test_a_down_nvlink_is_seen_from_both_ends_and_the_smaller_count_wins():
    """A down NVLink is counted from both ends and the smaller count wins."""
    sim = SimulatedNvml(catalog_machine("dgx1-v100"))
    sim.set_nvlink_active(0, 0, False)  # link 0 of GPU0 goes to GPU1 (NV2)
    found = discover(sim, None)
    assert found.topology.link(0, 1).nvlinks == 1
    assert found.warnings == ("GPU 0-GPU 1: 1 NVLinks one way, 2 the other; using the smaller",)


def test_unreadable_nvlinks_let_topo_settle_the_pair():
    """Pairs whose NVLinks NVML cannot read are settled by `topo -m`."""
    snapshot = read_nvml(SimulatedNvml(catalog_machine("dgx1-v100")))
    blind = replace(snapshot, nvlinks=(None,) * 8, nvlink_p2p=MappingProxyType({}))
    links = links_from_nvml(blind)
    assert (0, 1) in links.unsettled
    merged = merge(blind, catalog_machine("dgx1-v100"))
    assert merged.topology.link(0, 1).nvlinks == 2
    assert merged.sources["links"] == SOURCE_TOPO


def test_p2p_over_nvlink_without_link_details_is_unsettled():
    """NVLink P2P without link details leaves the pair for `topo -m` to settle."""
    snapshot = read_nvml(SimulatedNvml(catalog_machine("dgx1-v100")))
    blind = replace(snapshot, nvlinks=((),) * 8)  # no link enumeration, but P2P NVLINK still OK
    links = links_from_nvml(blind)
    assert links.links[(0, 1)].kind is LinkKind.NV
    assert (0, 1) in links.unsettled
    assert merge(blind, catalog_machine("dgx1-v100")).topology.link(0, 1).nvlinks == 2


def test_mig_devices_come_from_nvml():
    """MIG mode and instances come from NVML."""
    from node_agent.sources.nvml_reader import MigInfo

    sim = SimulatedNvml(catalog_machine("dgx-a100"))
    sim.set_mig(2, MigInfo(MigMode.ENABLED, (MigDevice("MIG-a", "3g.20gb", 1, 0, 19968),)))
    gpu = discover(sim, topo_text("dgx-a100")).topology.gpus[2]
    assert gpu.mig_mode is MigMode.ENABLED
    assert gpu.mig_devices[0].profile == "3g.20gb"


def test_a_gpu_that_cannot_be_named_falls_back_to_topo():
    """When NVML cannot name every GPU, discovery falls back to `topo -m`."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    sim.set_gpu_lost(5)
    found = discover(sim, topo_text("hgx-h100"), model_hint="H100")
    assert any("NVML unusable" in w for w in found.warnings)
    assert set(found.sources.values()) == {SOURCE_TOPO}


def test_snapshot_is_plain_data():
    """The NVML snapshot is plain data, with every pair's level read once."""
    snapshot = read_nvml(SimulatedNvml(catalog_machine("hgx-h100")))
    assert isinstance(snapshot, NvmlReading)
    assert len(snapshot.levels) == 28 and len(snapshot.identities) == 8
