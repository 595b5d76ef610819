"""Fuzz `topology.codec_memo`: with a shape's template in place, every spec, valid or damaged in one
place, gets exactly the full decode's answer (the same topology, hash and warnings, or the same
CodecError message); nothing else escapes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.contract_support import mutations
from tests.fuzz.fuzz_settings import fuzz
from tests.fuzz.test_gpu_topology_fuzz import topologies
from topology import codec_memo
from topology.codec import CodecError, decode_with_hash, encode_topology
from topology.model import NodeTopology


def _spec(topology: NodeTopology, node: int) -> dict[str, Any]:
    gpus = tuple(
        replace(g, uuid=f"GPU-{node}-{g.index}", pci_bus_id=f"{node}:{g.index}") for g in topology.gpus
    )
    return json.loads(json.dumps(encode_topology(replace(topology, gpus=gpus))))


def _outcome(decode: Any, data: Any) -> Any:
    try:
        topology, digest = decode(data)
    except CodecError as exc:
        return f"CodecError: {exc}"
    return topology, digest, topology.warnings


@pytest.mark.timeout(120)
@fuzz(max_examples=200)
@given(topologies(), st.data())
def test_damaged_specs_of_a_warm_shape_get_the_full_decodes_answer(
    topology: NodeTopology, data: st.DataObject
) -> None:
    """A random topology seen on two nodes (so it has a template), then a third node's spec with
    one place changed (retyped, replaced, deleted, inserted, wrapped, duplicated)."""
    codec_memo.forget()
    for node in (1, 2):
        codec_memo.decode_with_hash(_spec(topology, node))
    assert codec_memo.memo_size().templates, "the shape should have a template"
    mutation = data.draw(mutations(_spec(topology, 3), root=False))
    try:
        assert _outcome(codec_memo.decode_with_hash, mutation.doc) == _outcome(decode_with_hash, mutation.doc)
    finally:
        codec_memo.forget()
