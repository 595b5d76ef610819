"""Decoding once per wiring: `codec_memo.decode_with_hash` always answers as the full decode does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import codec_memo
from topology.catalog import load_machine, machine_names
from topology.codec import CodecError, decode_with_hash, encode_topology
from topology.model import NodeTopology

MACHINES = {name: load_machine(name) for name in machine_names()}


@pytest.fixture(autouse=True)
def fresh_memo() -> Iterator[None]:
    codec_memo.forget()
    yield
    codec_memo.forget()


def _spec(topology: NodeTopology, node: int = 0, memory: int | None = None) -> dict[str, Any]:
    """The topology with node-specific GPU identity, encoded and read back as the API returns it."""
    gpus = tuple(
        replace(
            g,
            uuid=f"GPU-node{node}-{g.index}",
            pci_bus_id=f"0000:{node % 256:02x}:{g.index:02x}.0",
            memory_mib=g.memory_mib if memory is None else memory,
        )
        for g in topology.gpus
    )
    return json.loads(json.dumps(encode_topology(replace(topology, gpus=gpus))))


def _outcome(decode: Any, data: Any) -> tuple[NodeTopology, str, tuple[str, ...]] | str:
    """(topology, hash, warnings) or the CodecError message."""
    try:
        topology, digest = decode(data)
    except CodecError as exc:
        return f"CodecError: {exc}"
    return topology, digest, topology.warnings


def _warm(spec: dict[str, Any]) -> None:
    """Decode the shape twice so that it has a template."""
    for _ in range(2):
        codec_memo.decode_with_hash(json.loads(json.dumps(spec)))
    assert codec_memo.memo_size().templates, "the shape should have a template"


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_catalog_machine_decodes_as_the_full_decode_on_every_sighting(name: str) -> None:
    """Each captured machine, ten nodes of it with their own UUIDs and bus ids: the same topology,
    hash and warnings as the full decode, before and after its shape has a template."""
    for node in range(10):
        spec = _spec(MACHINES[name], node)
        assert _outcome(codec_memo.decode_with_hash, spec) == _outcome(decode_with_hash, spec)
    assert codec_memo.memo_size().templates == 1


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.sampled_from(sorted(MACHINES)),
    st.lists(st.tuples(st.text(max_size=40), st.text(max_size=16), st.integers(0, 2**62)), min_size=1),
    st.lists(st.text(max_size=12), max_size=3),
)
def test_random_identities_decode_as_the_full_decode(
    name: str, identities: list[tuple[str, str, int]], warnings: list[str]
) -> None:
    """Random per-GPU UUIDs, bus ids (any unicode), memory sizes and warnings on a warm shape: the
    fast path gives exactly the full decode's topology, hash and warnings."""
    base = MACHINES[name]
    _warm(_spec(base))
    gpus = tuple(
        replace(g, uuid=uuid, pci_bus_id=pci, memory_mib=memory)
        for g, (uuid, pci, memory) in zip(base.gpus, identities * len(base.gpus), strict=False)
    )
    spec = json.loads(json.dumps(encode_topology(replace(base, gpus=gpus, warnings=tuple(warnings)))))
    assert _outcome(codec_memo.decode_with_hash, spec) == _outcome(decode_with_hash, spec)


def test_a_hit_shares_the_wiring_of_its_template() -> None:
    """Nodes of one shape share one tuple of links, NICs and NIC links (less memory per node)."""
    _warm(_spec(MACHINES["dgx-a100"], 0))
    one, _ = codec_memo.decode_with_hash(_spec(MACHINES["dgx-a100"], 1))
    two, _ = codec_memo.decode_with_hash(_spec(MACHINES["dgx-a100"], 2))
    assert one.gpu_links is two.gpu_links and one.nic_links is two.nic_links
    assert one.gpus[0].uuid == "GPU-node1-0" and two.gpus[0].uuid == "GPU-node2-0"


def test_a_different_memory_size_on_a_warm_shape_is_substituted() -> None:
    """memoryMiB is per-GPU identity: a node reporting less memory gets its own figure and hash."""
    _warm(_spec(MACHINES["hgx-h100"]))
    spec = _spec(MACHINES["hgx-h100"], 3, memory=81559)
    topology, digest = codec_memo.decode_with_hash(spec)
    assert {g.memory_mib for g in topology.gpus} == {81559}
    assert (topology, digest) == decode_with_hash(spec)


BROKEN: list[tuple[str, Any]] = [
    ("uuid a number", lambda s: s["gpus"][0].__setitem__("uuid", 7)),
    ("uuid missing", lambda s: s["gpus"][1].pop("uuid")),
    ("bus id null", lambda s: s["gpus"][2].__setitem__("pciBusId", None)),
    ("memory negative", lambda s: s["gpus"][0].__setitem__("memoryMiB", -1)),
    ("memory true", lambda s: s["gpus"][0].__setitem__("memoryMiB", True)),
    ("memory a float", lambda s: s["gpus"][0].__setitem__("memoryMiB", 81920.0)),
    ("hash stale", lambda s: s.__setitem__("contentHash", "0" * 64)),
    ("warning a number", lambda s: s.__setitem__("warnings", ["ok", 3])),
    ("warnings an object", lambda s: s.__setitem__("warnings", {"a": "b"})),
    ("nvlinks true", lambda s: s["links"][0].__setitem__("nvlinks", True)),
    ("index a float", lambda s: s["gpus"][0].__setitem__("index", 0.0)),
    ("links a tuple", lambda s: s.__setitem__("links", tuple(s["links"]))),
    ("gpu a mapping proxy", lambda s: s["gpus"].__setitem__(0, MappingProxyType(s["gpus"][0]))),
    ("schema version", lambda s: s.__setitem__("schemaVersion", "linkpack.io/topology/v0")),
]


@pytest.mark.parametrize(("what", "damage"), BROKEN, ids=[what for what, _ in BROKEN])
def test_damaged_specs_on_a_warm_shape_get_the_full_decodes_answer(what: str, damage: Any) -> None:
    """A spec of a shape that has a template, damaged in one place (identity of the wrong type,
    a stale hash, bad warnings, true for 1, a tuple for a list): the same error, or the same
    topology where the full decode accepts it."""
    _warm(_spec(MACHINES["dgx-a100"]))
    spec = _spec(MACHINES["dgx-a100"], 5)
    damage(spec)
    assert _outcome(codec_memo.decode_with_hash, spec) == _outcome(decode_with_hash, spec)


def test_a_mapping_that_is_not_a_dict_takes_the_full_decode() -> None:
    """A read-only mapping at the root decodes (in full) to the same topology."""
    _warm(_spec(MACHINES["dgx1-v100"]))
    spec = _spec(MACHINES["dgx1-v100"], 4)
    proxied = MappingProxyType(spec)
    assert codec_memo.decode_with_hash(proxied) == decode_with_hash(spec)


def test_a_shape_whose_text_holds_the_identity_mark_gets_no_template() -> None:
    """A model name containing the mark the template cuts at: no template, still the full answer."""
    base = MACHINES["dgx-a100"]
    marked = replace(base, gpus=tuple(replace(g, model="x\x00linkpack-identity-0\x00") for g in base.gpus))
    for node in range(3):
        spec = _spec(marked, node)
        assert _outcome(codec_memo.decode_with_hash, spec) == _outcome(decode_with_hash, spec)
    assert codec_memo.memo_size().templates == 0


def test_the_memo_keeps_at_most_its_limit_of_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond MAX_TEMPLATES the oldest shape is dropped; every answer stays the full decode's."""
    monkeypatch.setattr(codec_memo, "MAX_TEMPLATES", 2)
    names = ["dgx-a100", "hgx-h100", "dgx1-v100", "rtx3090-2socket"]
    for round_no in range(3):
        for name in names:
            spec = _spec(MACHINES[name], round_no)
            assert _outcome(codec_memo.decode_with_hash, spec) == _outcome(decode_with_hash, spec)
    assert codec_memo.memo_size().templates == 2


def test_keys_seen_once_are_forgotten_beyond_their_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unique shapes (here: per-node MIG-like model names) never build templates and the record
    of shapes seen once stays bounded."""
    monkeypatch.setattr(codec_memo, "MAX_SEEN", 5)
    base = MACHINES["a30-pairs"]
    for node in range(12):
        unique = replace(base, gpus=tuple(replace(g, model=f"model-{node}") for g in base.gpus))
        spec = _spec(unique, node)
        assert _outcome(codec_memo.decode_with_hash, spec) == _outcome(decode_with_hash, spec)
    size = codec_memo.memo_size()
    assert size.templates == 0 and size.seen <= 5
