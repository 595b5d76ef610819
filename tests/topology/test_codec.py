"""The versioned JSON codec: exact round trips, a stable content hash, and specific errors."""

from __future__ import annotations

import copy
import json
from itertools import combinations
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import machines
from topology.catalog import load_machine, synthetic_dgx2
from topology.codec import SCHEMA_VERSION, CodecError, content_hash, decode_topology, encode_topology
from topology.model import Gpu, GpuLink, LinkKind, MigDevice, MigMode, Nic, NicLink, NodeTopology


@pytest.fixture(scope="module")
def dgx_a100() -> NodeTopology:
    return machines.dgx_a100()


def test_dgx_a100_round_trips_exactly_through_json_text(dgx_a100: NodeTopology) -> None:
    """DGX A100 encoded, dumped to JSON text, loaded and decoded equals the original."""
    decoded = decode_topology(json.loads(json.dumps(encode_topology(dgx_a100))))
    assert decoded == dgx_a100
    assert decoded.warnings == dgx_a100.warnings


def test_encoded_dgx_a100_has_the_documented_shape(dgx_a100: NodeTopology) -> None:
    """Top-level keys, camelCase GPU fields, legend words for kinds and derived NVLink bandwidth."""
    encoded = encode_topology(dgx_a100)
    assert list(encoded) == [
        "schemaVersion", "contentHash", "gpus", "links", "nics", "nicLinks", "nvswitch", "sources", "warnings"
    ]  # fmt: skip
    assert encoded["schemaVersion"] == SCHEMA_VERSION
    assert encoded["contentHash"] == content_hash(dgx_a100)
    gpu0 = encoded["gpus"][0]
    assert gpu0["memoryMiB"] == 40960 and gpu0["numaNode"] == 3 and gpu0["gpuNumaId"] is None
    assert gpu0["cpuAffinity"] == "48-63,176-191" and gpu0["migMode"] == "unsupported"
    assert encoded["links"][0] == {"a": 0, "b": 1, "kind": "NV", "nvlinks": 12, "bandwidthGBps": 300.0}
    assert encoded["nicLinks"][0] == {"gpu": 0, "nic": 0, "kind": "PXB"}
    assert encoded["sources"] == [{"fact": "links", "source": "nvidia-smi topo -m"}]


def test_pcie_links_have_zero_nvlinks_and_pcie_bandwidth() -> None:
    """RTX 3090 pairs are NODE/SYS with nvlinks 0 and a PCIe-derived bandwidth."""
    encoded = encode_topology(load_machine("rtx3090-2socket"))
    link = encoded["links"][0]
    assert (link["kind"], link["nvlinks"]) == ("NODE", 0)
    assert 0 < link["bandwidthGBps"] < 32


def test_content_hash_is_stable_and_ignores_warnings(dgx_a100: NodeTopology) -> None:
    """The hash is a fixed sha256 hex for the same facts and does not change with warnings."""
    from dataclasses import replace

    assert content_hash(dgx_a100) == content_hash(load_machine("dgx-a100"))
    assert content_hash(replace(dgx_a100, warnings=("something",))) == content_hash(dgx_a100)
    assert len(content_hash(dgx_a100)) == 64
    assert content_hash(dgx_a100) != content_hash(replace(dgx_a100, nvswitch=False))


def test_mig_devices_round_trip() -> None:
    """A MIG-enabled A100 with two instances survives encode/decode."""
    gpu = Gpu(
        0,
        uuid="GPU-1",
        model="A100",
        mig_mode=MigMode.ENABLED,
        mig_devices=(MigDevice("MIG-a", "1g.10gb", 7, 0, 9728), MigDevice("MIG-b", "3g.40gb", 2, 0, 40192)),
    )
    topo = NodeTopology(gpus=(gpu,))
    assert decode_topology(encode_topology(topo)) == topo


# ----------------------------------------------------------------------------- errors


def broken(mutate: Any) -> dict[str, Any]:
    encoded = copy.deepcopy(encode_topology(synthetic_two_gpu()))
    mutate(encoded)
    return encoded


def synthetic_two_gpu() -> NodeTopology:
    return NodeTopology(
        gpus=(Gpu(0, model="A30"), Gpu(1, model="A30")),
        gpu_links=(GpuLink(0, 1, LinkKind.NV, 4),),
        nics=(Nic(0, "mlx5_0"),),
        nic_links=(NicLink(0, 0, LinkKind.PIX), NicLink(1, 0, LinkKind.SYS)),
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schemaVersion="linkpack.io/topology/v0"), "schemaVersion: unsupported"),
        (lambda d: d.pop("schemaVersion"), "schemaVersion: unsupported None"),
        (lambda d: d.pop("gpus"), "gpus: missing"),
        (lambda d: d.update(gpus={}), "gpus: expected a list"),
        (lambda d: d["gpus"][1].pop("memoryMiB"), "gpus[1].memoryMiB: missing"),
        (lambda d: d["gpus"][0].update(index="0"), "gpus[0].index: expected int"),
        (lambda d: d["gpus"][0].update(index=True), "gpus[0].index: expected int"),
        (lambda d: d["gpus"][0].update(memoryMiB=-1), "gpus[0].memoryMiB: must not be negative"),
        (lambda d: d["gpus"][1].update(index=0), "gpus: index 0 appears twice"),
        (lambda d: d["gpus"][0].update(migMode="maybe"), "gpus[0].migMode: 'maybe' is not one of"),
        (lambda d: d["links"][0].update(kind="NVLINK"), "links[0].kind: 'NVLINK' is not one of NV"),
        (lambda d: d["links"][0].update(nvlinks=0), "links[0]: GpuLink 0-1: kind NV with nvlinks=0"),
        (lambda d: d["links"][0].update(a=1, b=0), "links[0]: GpuLink endpoints must be ordered"),
        (lambda d: d["links"][0].update(b=5), "links[0].b: 5 is not a listed index"),
        (lambda d: d["links"].append(dict(d["links"][0])), "links: GPU pair (0, 1) appears twice"),
        (lambda d: d["nicLinks"][0].update(nic=3), "nicLinks[0].nic: 3 is not a listed index"),
        (lambda d: d["nics"].append("mlx5_1"), "nics[1]: expected an object"),
        (lambda d: d.update(nvswitch="yes"), "topology.nvswitch: expected bool"),
        (lambda d: d.update(warnings=[1]), "warnings[0]: expected a string"),
        (lambda d: d["sources"].append({"fact": "x"}), "sources[0].source: missing"),
        (lambda d: d.update(contentHash="0" * 64), "contentHash: '000"),
    ],
)
def test_bad_documents_raise_codec_error_naming_the_field(mutate: Any, message: str) -> None:
    """Each malformed field gives a CodecError (a ValueError) whose message names the field."""
    with pytest.raises(CodecError) as caught:
        decode_topology(broken(mutate))
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_non_object_input_is_a_codec_error() -> None:
    """A list where the topology object should be is rejected, not indexed into."""
    with pytest.raises(CodecError, match="topology: expected an object, got list"):
        decode_topology([])


def test_content_hash_and_bandwidth_are_optional_on_decode() -> None:
    """A hand-written spec without contentHash, warnings or bandwidthGBps still decodes."""
    encoded = encode_topology(synthetic_two_gpu())
    del encoded["contentHash"], encoded["warnings"], encoded["links"][0]["bandwidthGBps"]
    assert decode_topology(encoded) == synthetic_two_gpu()


# ----------------------------------------------------------------------------- property


@st.composite
def topologies(draw: st.DrawFn) -> NodeTopology:
    count = draw(st.integers(0, 6))
    text = st.text(max_size=12)
    small = st.integers(0, 10**6)
    gpus = tuple(
        Gpu(
            index=i,
            uuid=draw(text),
            model=draw(st.sampled_from(["", "A100-SXM4-40GB", "H100 80GB HBM3", "RTX 4090", "Tesla V100"])),
            memory_mib=draw(small),
            pci_bus_id=draw(text),
            numa_node=draw(st.none() | st.integers(0, 7)),
            cpu_affinity=draw(text),
            gpu_numa_id=draw(st.none() | st.integers(0, 40)),
            mig_mode=draw(st.sampled_from(list(MigMode))),
            mig_devices=tuple(
                draw(st.lists(st.builds(MigDevice, text, text, small, small, small), max_size=2))
            ),
        )
        for i in range(count)
    )
    kinds = st.sampled_from(list(LinkKind))
    links = []
    for a, b in combinations(range(count), 2):
        kind = draw(kinds)
        links.append(GpuLink(a, b, kind, draw(st.integers(1, 18)) if kind is LinkKind.NV else 0))
    nics = tuple(Nic(i, draw(text)) for i in range(draw(st.integers(0, 3))))
    nic_links = tuple(NicLink(g.index, n.index, draw(kinds)) for g in gpus for n in nics)
    sources = tuple(draw(st.lists(st.tuples(text, text), max_size=3)))
    warnings = tuple(draw(st.lists(text, max_size=2)))
    return NodeTopology(gpus, tuple(links), nics, nic_links, draw(st.booleans()), sources, warnings)


@settings(max_examples=60, deadline=None)
@given(topologies())
def test_any_topology_round_trips_exactly(topology: NodeTopology) -> None:
    """Encode → JSON text → decode gives back an equal topology (warnings included) and the same hash."""
    encoded = encode_topology(topology)
    decoded = decode_topology(json.loads(json.dumps(encoded)))
    assert decoded == topology
    assert decoded.warnings == topology.warnings
    assert content_hash(decoded) == encoded["contentHash"]


def test_dgx2_round_trips_with_sixteen_gpus() -> None:
    """The synthetic 16-GPU DGX-2 has 120 NV6 links and round-trips."""
    dgx2 = synthetic_dgx2()
    assert len(encode_topology(dgx2)["links"]) == 120
    assert decode_topology(encode_topology(dgx2)) == dgx2
