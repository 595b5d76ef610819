"""Quantities and resource names: one parser and one reader for every program."""

from __future__ import annotations

from fractions import Fraction

import pytest

from contract.quantity import QuantityError, parse_quantity, whole_quantity
from contract.resources import (
    ResourceConfigError,
    ResourceKind,
    ResourceNames,
    units_per_gpu_from_env,
)

# The resource names are literal here: these tests check the contract's default names and the
# settings that change them, so the text itself is the point.

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("900k", 900_000), ("1Ki", 1024), ("1Gi", 2**30), ("500m", Fraction(1, 2)), ("1e3", 1000),
     ("1.5", Fraction(3, 2)), (" 4 ", 4), ("+3", 3), ("2M", 2_000_000)],
)  # fmt: skip
def test_quantities_parse_exactly(text: str, value: Fraction | int) -> None:
    """Every suffix Kubernetes writes is understood, exactly."""
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Ki", "1.2.3", "1x", "e3", "1e", "1e9999", "--1"])
def test_junk_is_not_a_quantity(text: str) -> None:
    """Text that is not a quantity is refused with an error quoting it."""
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1.5", "500m", "-1"])
def test_whole_quantity_refuses_fractions_and_negatives(text: str) -> None:
    """Extended resources are whole, non-negative numbers."""
    with pytest.raises(QuantityError, match="whole"):
        whole_quantity(text)


def test_resource_names_from_env_and_their_kinds() -> None:
    """Names are read once from LINKPACK_RESOURCE_*, and each name maps to one kind."""
    names = ResourceNames.from_env({"LINKPACK_RESOURCE_GPU": "example.com/gpu"})
    assert names.whole == "example.com/gpu"
    assert names.kind("example.com/gpu") is ResourceKind.WHOLE
    assert names.kind("nvidia.com/gpu.shared") is ResourceKind.SHARED_UNITS
    assert names.kind("nvidia.com/mig-1g.10gb") is ResourceKind.MIG
    assert names.mig_profile("nvidia.com/mig-1g.10gb") == "1g.10gb"
    assert names.kind("nvidia.com/mig-") is None
    assert names.kind("cpu") is None


@pytest.mark.parametrize(
    "env",
    [{"LINKPACK_RESOURCE_GPU": "gpu"}, {"LINKPACK_RESOURCE_SHARED": "nvidia.com/gpu"},
     {"LINKPACK_RESOURCE_MIG_PREFIX": "nvidia.com/gpu"}],
)  # fmt: skip
def test_unusable_resource_names_name_the_variable(env: dict[str, str]) -> None:
    """A name without a domain, or two settings naming the same resource, is refused."""
    with pytest.raises(ResourceConfigError, match=r"LINKPACK_RESOURCE|must differ"):
        ResourceNames.from_env(env)


def test_units_per_gpu() -> None:
    """Units per GPU default to 100 and must be a positive whole number."""
    assert units_per_gpu_from_env({}) == 100
    assert units_per_gpu_from_env({"LINKPACK_UNITS_PER_GPU": "1000"}) == 1000
    for bad in ("0", "ten"):
        with pytest.raises(ResourceConfigError, match="LINKPACK_UNITS_PER_GPU"):
            units_per_gpu_from_env({"LINKPACK_UNITS_PER_GPU": bad})
