"""Fuzz `contract.allocation`: the pod annotations `linkpack.io/allocation` and `linkpack.io/consumed`.

Anyone who can create a pod can write these annotations, so the node agent and the extender
decode hostile text: only AllocationError may escape, its message says which field, and every
valid record survives encode -> decode unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.allocation import (
    Allocation,
    AllocationError,
    Consumption,
    Enforcement,
    decode_allocation,
    decode_consumption,
    encode_allocation,
    encode_consumption,
)
from tests.fuzz.contract_support import (
    ContractViolation,
    decode_checked,
    json_values,
    mutated_json_text,
    mutations,
    names_path,
    render_path,
    tolerating_known_bugs,
)
from tests.fuzz.corpus_support import expectation, read_text, replay_params
from tests.fuzz.fuzz_settings import fuzz
from topology.scheduling import GpuGrant

grants = st.builds(
    GpuGrant,
    index=st.integers(),
    uuid=st.text(max_size=40),
    whole=st.booleans(),
    memory_mib=st.integers(),
    units=st.integers(),
    mig_uuid=st.text(max_size=40),
)
allocations = st.builds(
    Allocation,
    node=st.text(max_size=30),
    grants=st.lists(grants, min_size=1, max_size=4).map(tuple),
    generation=st.integers(),
    enforcement=st.sampled_from(Enforcement),
    resources=st.dictionaries(st.text(max_size=20), st.integers(), max_size=3).map(
        lambda d: tuple(sorted(d.items()))
    ),
)
consumptions = st.builds(
    Consumption,
    generation=st.integers(),
    containers=st.lists(st.text(max_size=20), max_size=4).map(tuple),
    device_ids=st.lists(st.text(max_size=40), max_size=4).map(tuple),
)


def _message_problem(message: str) -> str | None:
    """An AllocationError names the record (allocation/consumed) and the field, or the schema."""
    if message.startswith(("allocation", "consumed")) or "schema" in message:
        return None
    return "names neither the record (allocation:/consumed:) nor the schema"


def decode(target: str, text: str) -> Allocation | Consumption | None:
    decoder = decode_allocation if target == "allocation" else decode_consumption
    value, _ = decode_checked(lambda: decoder(text), AllocationError, _message_problem, text)
    return value


def decode_mutated(target: str, doc: object, path: tuple[str | int, ...], op: str) -> None:
    """Decode a mutated document; a refusal of a retyped field must name that field's path."""
    text = json.dumps(doc)
    decoder = decode_allocation if target == "allocation" else decode_consumption

    def problem(message: str) -> str | None:
        if op == "retype" and not names_path(message, path):
            return f"does not name the retyped field {render_path(path)}"
        return _message_problem(message)

    decode_checked(lambda: decoder(text), AllocationError, problem, text)


# ---------------------------------------------------------------------- round trips


@pytest.mark.timeout(120)
@fuzz(max_examples=200)
@given(allocations)
def test_allocation_round_trips(allocation: Allocation) -> None:
    """Every allocation decodes from its encoding to an equal allocation."""
    assert decode("allocation", encode_allocation(allocation)) == allocation


@pytest.mark.timeout(120)
@fuzz(max_examples=100)
@given(consumptions)
def test_consumption_round_trips(consumption: Consumption) -> None:
    """Every consumed record decodes from its encoding to an equal record."""
    assert decode("consumption", encode_consumption(consumption)) == consumption


# ---------------------------------------------------------------------- mutations and junk


@pytest.mark.timeout(120)
@fuzz(max_examples=300)
@given(st.data())
def test_mutated_allocations_are_refused_naming_the_field(data: st.DataObject) -> None:
    """One field of a valid allocation deleted, retyped, replaced or wrapped: decoded or refused by name."""
    mutation = data.draw(allocations.map(lambda a: json.loads(encode_allocation(a))).flatmap(mutations))
    tolerating_known_bugs(
        "allocation", lambda: decode_mutated("allocation", mutation.doc, mutation.path, mutation.op)
    )


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(st.data())
def test_mutated_consumptions_are_refused_naming_the_field(data: st.DataObject) -> None:
    """One field of a valid consumed record changed: decoded or refused by name."""
    mutation = data.draw(consumptions.map(lambda c: json.loads(encode_consumption(c))).flatmap(mutations))
    tolerating_known_bugs(
        "consumption", lambda: decode_mutated("consumption", mutation.doc, mutation.path, mutation.op)
    )


@pytest.mark.timeout(120)
@fuzz(max_examples=250)
@given(st.sampled_from(["allocation", "consumption"]), st.data())
def test_damaged_annotation_text_is_refused(target: str, data: st.DataObject) -> None:
    """Flipped bytes, truncation, huge numbers and deep nesting in the annotation's JSON text."""
    valid = data.draw(
        allocations.map(encode_allocation) if target == "allocation" else consumptions.map(encode_consumption)
    )
    text = data.draw(mutated_json_text(valid))
    tolerating_known_bugs(target, lambda: decode(target, text))


@pytest.mark.timeout(120)
@fuzz(max_examples=200)
@given(st.sampled_from(["allocation", "consumption"]), json_values.map(json.dumps) | st.text(max_size=200))
def test_random_json_and_text_are_refused(target: str, text: str) -> None:
    """Random JSON documents and random text decode or are refused with AllocationError."""
    tolerating_known_bugs(target, lambda: decode(target, text))


# ---------------------------------------------------------------------- corpus


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("target", "path"),
    [
        pytest.param("allocation", p.values[0], id=f"allocation/{p.id}", marks=p.marks)
        for p in replay_params("allocation", ContractViolation)
    ]
    + [
        pytest.param("consumption", p.values[0], id=f"consumption/{p.id}", marks=p.marks)
        for p in replay_params("consumption", ContractViolation)
    ],
)
def test_corpus_entry(target: str, path: Path) -> None:
    """Each corpus entry keeps the contract; ok- entries decode (and re-encode identically), err- are refused."""
    text = read_text(path)
    value = decode(target, text)
    if expectation(path) == "ok":
        assert value is not None
        encode = encode_allocation if target == "allocation" else encode_consumption
        assert encode(value) == text  # type: ignore[arg-type]
    elif expectation(path) == "err":
        assert value is None
