"""Fuzz `contract.ledger`: the per-node allocation ledger ConfigMaps.

`decode_ledger` (the ConfigMap's data) and `ledger_from_config_map` (the whole object as the API
returns it) accept anything JSON can hold: only LedgerError may escape, it names the node and
the entry, and every ledger survives encode -> decode unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.allocation import Allocation, Enforcement
from contract.keys import ledger_name
from contract.ledger import (
    Ledger,
    LedgerEntry,
    LedgerError,
    decode_ledger,
    encode_ledger,
    ledger_from_config_map,
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
from tests.fuzz.corpus_support import expectation, read_json, replay_params
from tests.fuzz.fuzz_settings import fuzz
from topology.scheduling import GpuGrant

NODE = "gpu-node-1"
_grants = st.builds(
    GpuGrant,
    index=st.integers(0, 15),
    uuid=st.text(max_size=12),
    whole=st.booleans(),
    memory_mib=st.integers(0, 2**20),
    units=st.integers(0, 100),
    mig_uuid=st.text(max_size=12),
)
_allocations = st.builds(
    Allocation,
    node=st.just(NODE),
    grants=st.lists(_grants, min_size=1, max_size=2).map(tuple),
    generation=st.integers(1, 10),
    enforcement=st.sampled_from(Enforcement),
)
_entries = st.builds(
    LedgerEntry,
    pod_uid=st.text(max_size=12),
    namespace=st.text(max_size=12),
    name=st.text(max_size=12),
    allocation=_allocations,
    reserved_at=st.floats(allow_nan=False, allow_infinity=False),
)
ledgers = st.builds(
    lambda node, entries, rv: Ledger(
        node, tuple(sorted(entries, key=lambda e: (e.reserved_at, e.pod_uid))), rv
    ),
    st.text(max_size=20),
    st.lists(_entries, max_size=3, unique_by=lambda e: e.pod_uid),
    st.text(max_size=8),
)


def _message_problem(node: str) -> Any:
    def problem(message: str) -> str | None:
        return (
            None if message.startswith(f"ledger of {node}:") else f"does not start with 'ledger of {node}:'"
        )

    return problem


def decode(
    node: str, data: Any, resource_version: str = "", must_name: tuple[str, ...] = ()
) -> Ledger | None:
    """The decoded ledger, or None when refused properly (naming the node, and `must_name`)."""

    def problem(message: str) -> str | None:
        missing = [part for part in must_name if part not in message]
        return f"does not name {', '.join(missing)}" if missing else _message_problem(node)(message)

    value, _ = decode_checked(lambda: decode_ledger(node, data, resource_version), LedgerError, problem, data)
    return value


def from_config_map(obj: Any) -> Ledger | None:
    def problem(message: str) -> str | None:
        return None if message.startswith("ledger of ") else "does not start with 'ledger of <node>:'"

    value, _ = decode_checked(lambda: ledger_from_config_map(obj), LedgerError, problem, obj)
    return value


# ---------------------------------------------------------------------- round trips


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(ledgers)
def test_ledger_round_trips_through_its_data(ledger: Ledger) -> None:
    """Every ledger decodes from its ConfigMap data (and from the whole ConfigMap) to an equal ledger."""
    data = json.loads(json.dumps(encode_ledger(ledger)))  # as the API returns it
    assert decode(ledger.node, data, ledger.resource_version) == ledger
    obj = {
        "metadata": {"name": ledger_name(ledger.node), "resourceVersion": ledger.resource_version},
        "data": data,
    }
    assert from_config_map(obj) == ledger


# ---------------------------------------------------------------------- mutations and junk


def _ledger_doc(ledger: Ledger) -> Any:
    return json.loads(encode_ledger(ledger)["ledger"])


@pytest.mark.timeout(120)
@fuzz(max_examples=200)
@given(st.data())
def test_mutated_ledger_documents_are_refused_naming_the_entry(data: st.DataObject) -> None:
    """One place of a valid ledger document changed: decoded, or refused naming the node and the field."""
    mutation = data.draw(ledgers.map(_ledger_doc).flatmap(mutations))
    text = json.dumps(mutation.doc)

    def problem(message: str) -> str | None:
        if not message.startswith(f"ledger of {NODE}:"):
            return f"does not start with 'ledger of {NODE}:'"
        if mutation.op == "retype" and not names_path(message, mutation.path):
            return f"does not name the retyped field {render_path(mutation.path)}"
        return None

    tolerating_known_bugs(
        "ledger",
        lambda: decode_checked(lambda: decode_ledger(NODE, {"ledger": text}, ""), LedgerError, problem, text),
    )


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(st.data())
def test_damaged_ledger_text_is_refused(data: st.DataObject) -> None:
    """Flipped bytes, truncation, huge numbers and deep nesting in the ledger's JSON text."""
    text = data.draw(ledgers.map(lambda ledger: encode_ledger(ledger)["ledger"]).flatmap(mutated_json_text))
    tolerating_known_bugs("ledger", lambda: decode(NODE, {"ledger": text}))


@pytest.mark.timeout(120)
@fuzz(max_examples=120)
@given(
    st.none()
    | st.dictionaries(st.sampled_from(["ledger", "other"]) | st.text(max_size=6), json_values, max_size=3)
)
def test_random_data_maps_are_refused(data: Any) -> None:
    """ConfigMap data of random shape: an empty ledger, a ledger, or LedgerError."""
    tolerating_known_bugs("ledger", lambda: decode(NODE, data))


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(st.data())
def test_mutated_config_maps_are_refused(data: st.DataObject) -> None:
    """A valid ledger ConfigMap with one place changed (metadata, data, the ledger text's type)."""
    ledger = data.draw(ledgers)
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ledger_name(ledger.node),
            "resourceVersion": "1",
            "labels": {"linkpack.io/ledger": "true"},
        },
        "data": encode_ledger(ledger),
    }
    mutation = data.draw(mutations(obj, root=False))  # the decoder takes a mapping
    tolerating_known_bugs("ledger-config-map", lambda: from_config_map(mutation.doc))


@pytest.mark.timeout(120)
@fuzz(max_examples=100)
@given(
    st.dictionaries(
        st.sampled_from(["metadata", "data", "kind"]) | st.text(max_size=6), json_values, max_size=3
    )
)
def test_random_config_maps_are_refused(obj: dict[str, Any]) -> None:
    """Random objects where a ConfigMap is expected: a ledger or LedgerError."""
    tolerating_known_bugs("ledger-config-map", lambda: from_config_map(obj))


# ---------------------------------------------------------------------- corpus


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params("ledger", ContractViolation))
def test_ledger_corpus_entry(path: Path) -> None:
    """Each ledger corpus entry ({node, data, resourceVersion[, mustName]}) keeps the contract."""
    entry = read_json(path)
    value = decode(entry["node"], entry["data"], entry["resourceVersion"], tuple(entry.get("mustName", ())))
    if expectation(path) == "ok":
        assert value is not None and value.node == entry["node"]
    elif expectation(path) == "err":
        assert value is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params("ledger-config-map", ContractViolation))
def test_config_map_corpus_entry(path: Path) -> None:
    """Each ConfigMap corpus entry keeps the contract; ok- entries decode, err- entries are refused."""
    value = from_config_map(read_json(path))
    if expectation(path) == "ok":
        assert value is not None
    elif expectation(path) == "err":
        assert value is None
