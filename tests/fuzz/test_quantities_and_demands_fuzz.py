"""Fuzz the small readers every program shares: `contract.quantity.parse_quantity`,
`contract.pod_demand.container_demands` and `contract.cordons.parse_cordons`.

A quantity parses exactly or raises QuantityError quoting the text; a pod spec's demands are
read or refused with PodSpecError naming the container and resource; the cordon annotation is
read whatever it holds (parse_cordons never raises) and every bad entry is reported by position.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.cordons import canonical_gpu_uuid, format_cordons, parse_cordons
from contract.pod_demand import ContainerRole, PodSpecError, container_demands
from contract.quantity import MAX_QUANTITY_CHARS, QuantityError, parse_quantity
from tests.fuzz.contract_support import (
    ODD_STRINGS,
    ContractViolation,
    decode_checked,
    json_values,
    mutations,
    tolerating_known_bugs,
)
from tests.fuzz.corpus_support import expectation, read_json, read_text, replay_params
from tests.fuzz.fuzz_settings import fuzz
from tests.support.resources import GPU, MEMORY, SHARED

_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_SUFFIXES = [*_DECIMAL, *_BINARY, "m", "e3", "E-2", "e+1", "e", "i", "K", "Q", "e+-5", "e1000", "mi", "kk"]
_DIGITS = st.text(alphabet="0123456789", max_size=6) | st.sampled_from(
    ["\u00b2", "\u0663", "\uff11", "\u2155", "1_0"]
)


def extended(resource: str) -> bool:
    return resource.startswith("nvidia.com/")


def parse(text: str) -> Fraction | None:
    def problem(message: str) -> str | None:
        quoted = text.strip()
        # a quantity longer than any Kubernetes accepts is quoted by its beginning only
        if len(quoted) > MAX_QUANTITY_CHARS:
            return (
                None
                if repr(quoted[:20]) in message and str(len(quoted)) in message
                else (f"does not quote the start and length of {quoted[:20]!r}...")
            )
        return None if repr(quoted) in message else f"does not quote the text {quoted!r}"

    value, _ = decode_checked(lambda: parse_quantity(text), QuantityError, problem, text)
    return value


def demands(spec: Any) -> Any:
    """`container_demands(spec)`, or None when refused with a message naming a container."""

    def problem(message: str) -> str | None:
        return None if message.startswith("container ") else "does not start with 'container <name>'"

    value, _ = decode_checked(lambda: container_demands(spec, extended), PodSpecError, problem, spec)
    return value


# ---------------------------------------------------------------------- quantities


@st.composite
def quantity_like(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "", "+", "-", "+-"]))
    whole, fraction = draw(_DIGITS), draw(st.none() | _DIGITS)
    body = whole + ("" if fraction is None else "." + fraction)
    pad = draw(st.sampled_from(["", " ", "\t", "\u00a0"]))
    return pad + sign + body + draw(st.sampled_from(_SUFFIXES)) + pad


@pytest.mark.timeout(120)
@fuzz(max_examples=300)
@given(quantity_like() | st.text(max_size=24) | st.sampled_from(ODD_STRINGS))
def test_quantity_parses_or_is_refused_quoting_the_text(text: str) -> None:
    """Quantity-shaped and random text parses or raises QuantityError that quotes the text."""
    tolerating_known_bugs("quantity", lambda: parse(text))


@pytest.mark.timeout(120)
@fuzz(max_examples=200)
@given(
    st.integers(0, 10**15),
    st.none() | st.text(alphabet="0123456789", min_size=1, max_size=6),
    st.sampled_from([*_DECIMAL, *_BINARY, "m"]) | st.integers(-30, 30).map(lambda e: f"e{e}"),
)
def test_valid_quantities_parse_exactly(whole: int, fraction: str | None, suffix: str) -> None:
    """`<digits>[.<digits>]<suffix>` is that number times the suffix's factor, exactly."""
    number = f"{whole}" + ("" if fraction is None else f".{fraction}")
    if suffix == "m":
        expected = Fraction(number) / 1000
    elif suffix.startswith("e"):
        expected = Fraction(number) * Fraction(10) ** int(suffix[1:])
    else:
        expected = Fraction(number) * {**_DECIMAL, **_BINARY}[suffix]
    assert parse(number + suffix) == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params("quantity", ContractViolation))
def test_quantity_corpus_entry(path: Path) -> None:
    """Each quantity corpus entry keeps the contract; ok- entries parse, err- entries are refused."""
    value = parse(read_text(path))
    if expectation(path) == "ok":
        assert value is not None
    elif expectation(path) == "err":
        assert value is None


# ---------------------------------------------------------------------- pod demands

_RESOURCES = [GPU, SHARED, MEMORY, "cpu", "memory"]
_amounts = st.integers(0, 10**6).map(str) | st.sampled_from(["1k", "2Ki", "1e3", "0", "3"])


def _container(name: str, amounts: dict[str, str], sidecar: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "resources": {"limits": amounts, "requests": dict(amounts)}}
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


@st.composite
def pod_specs(draw: st.DrawFn) -> dict[str, Any]:
    def containers(prefix: str, init: bool) -> list[dict[str, Any]]:
        count = draw(st.integers(0, 3))
        amounts = st.dictionaries(st.sampled_from(_RESOURCES), _amounts, max_size=3)
        return [_container(f"{prefix}{i}", draw(amounts), init and draw(st.booleans())) for i in range(count)]

    return {"initContainers": containers("init-", True), "containers": containers("app-", False)}


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(pod_specs())
def test_demands_of_valid_specs_are_read_exactly(spec: dict[str, Any]) -> None:
    """Whole quantities of extended resources are read per container, in init-then-app order."""
    read = demands(spec)
    assert read is not None
    expected = []
    for container in [*spec["initContainers"], *spec["containers"]]:
        amounts = {
            r: int(parse_quantity(v)) for r, v in container["resources"]["limits"].items() if extended(r)
        }
        expected.append((container["name"], tuple(sorted((r, a) for r, a in amounts.items() if a > 0))))
    assert [(d.name, d.amounts) for d in read] == expected
    roles = [d.role for d in read]
    assert roles.count(ContainerRole.APP) == len(spec["containers"])


@pytest.mark.timeout(120)
@fuzz(max_examples=250)
@given(st.data())
def test_mutated_specs_are_refused_naming_container_and_resource(data: st.DataObject) -> None:
    """One place of a valid pod spec changed: read, or refused naming the container (and resource)."""
    mutation = data.draw(pod_specs().flatmap(lambda spec: mutations(spec, root=False)))
    spec, path = mutation.doc, mutation.path

    def problem(message: str) -> str | None:
        if not message.startswith("container "):
            return "does not start with 'container <name>'"
        if mutation.op == "retype" and len(path) >= 3 and isinstance(path[1], int):
            try:
                container = spec[path[0]][path[1]]
                name = str(container.get("name") or "?")
            except (KeyError, IndexError, TypeError, AttributeError):
                return None
            if f"container {name}" not in message:
                return f"does not name container {name!r}"
            in_amounts = len(path) >= 5 and path[2:4] in (("resources", "limits"), ("resources", "requests"))
            if in_amounts and str(path[4]) not in message:
                return f"does not name resource {path[4]!r}"
        return None

    def check() -> Any:
        return decode_checked(lambda: container_demands(spec, extended), PodSpecError, problem, spec)

    tolerating_known_bugs("pod-demand", check)


@pytest.mark.timeout(120)
@fuzz(max_examples=150)
@given(
    st.dictionaries(
        st.sampled_from(["containers", "initContainers"]),
        st.lists(
            st.dictionaries(
                st.sampled_from(["name", "resources", "restartPolicy"]),
                json_values
                | st.fixed_dictionaries(
                    {"limits": st.dictionaries(st.sampled_from(_RESOURCES), json_values)}
                ),
            ),
            max_size=3,
        )
        | json_values,
    )
)
def test_random_specs_are_read_or_refused(spec: dict[str, Any]) -> None:
    """Random container lists, resources and quantities: read or PodSpecError, nothing else."""
    tolerating_known_bugs("pod-demand", lambda: demands(spec))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params("pod-demand", ContractViolation))
def test_pod_demand_corpus_entry(path: Path) -> None:
    """Each pod-spec corpus entry ({spec}) keeps the contract; ok- entries are read, err- refused."""
    value = demands(read_json(path)["spec"])
    if expectation(path) == "ok":
        assert value is not None
    elif expectation(path) == "err":
        assert value is None


# ---------------------------------------------------------------------- cordons


def _check_cordons(value: str | None) -> None:
    try:
        cordons = parse_cordons(value)
    except Exception as exc:
        raise ContractViolation(
            f"{type(exc).__module__}.{type(exc).__qualname__}", f"{exc}; input {value!r}"
        ) from exc
    if value is None or not value.strip():
        assert cordons.uuids == frozenset() and cordons.problems == ()
        return
    entries = value.split(",")
    assert len(cordons.problems) + sum(1 for e in entries if canonical_gpu_uuid(e) in cordons.uuids) == len(
        entries
    )
    for problem in cordons.problems:
        assert problem.startswith("linkpack.io/cordoned-gpus: entry "), problem


_UUID = st.uuids().map(lambda u: f"GPU-{u}")


@pytest.mark.timeout(120)
@fuzz(max_examples=250)
@given(
    st.none()
    | st.text(max_size=80)
    | st.lists(
        _UUID | _UUID.map(str.upper) | st.sampled_from(ODD_STRINGS) | st.text(max_size=12), max_size=5
    ).map(",".join)
)
def test_cordons_never_raise_and_report_every_bad_entry(value: str | None) -> None:
    """Any annotation value is read; each entry is a cordoned UUID or a problem naming its position."""
    tolerating_known_bugs("cordons", lambda: _check_cordons(value))


@pytest.mark.timeout(120)
@fuzz(max_examples=100)
@given(st.sets(_UUID | _UUID.map(str.upper), max_size=5))
def test_cordons_round_trip(uuids: set[str]) -> None:
    """Formatting a set of GPU UUIDs and reading it back gives the same (canonical) set, no problems."""
    cordons = parse_cordons(format_cordons(uuids))
    assert cordons.uuids == {canonical_gpu_uuid(u) for u in uuids} and cordons.problems == ()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", replay_params("cordons", ContractViolation))
def test_cordons_corpus_entry(path: Path) -> None:
    """Each cordon corpus entry is read without raising and reports each bad entry."""
    _check_cordons(read_text(path))
