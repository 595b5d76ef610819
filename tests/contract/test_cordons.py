"""The cordon annotation, read the same way by every program."""

from __future__ import annotations

import pytest

from contract.cordons import canonical_gpu_uuid, format_cordons, parse_cordons

pytestmark = pytest.mark.timeout(10)

UPPER = "GPU-DA87D0C6-1A2B-3C4D-5E6F-0123456789AB"
LOWER = "GPU-da87d0c6-1a2b-3c4d-5e6f-0123456789ab"


def test_upper_case_uuid_cordons_the_lower_case_gpu() -> None:
    """UUIDs compare case-insensitively: an operator's upper-case paste cordons the GPU."""
    cordons = parse_cordons(UPPER)
    assert cordons.covers(LOWER) and cordons.covers(UPPER)
    assert cordons.indices([(0, "GPU-00000000-0000-0000-0000-000000000000"), (3, LOWER)]) == frozenset({3})
    assert cordons.problems == ()


def test_junk_is_reported_and_valid_entries_still_cordon() -> None:
    """A MIG UUID, an index and an empty entry are each reported; the real UUID stays cordoned."""
    cordons = parse_cordons(f"{UPPER}, MIG-1234,3,,")
    assert cordons.uuids == frozenset({LOWER})
    assert len(cordons.problems) == 4
    assert "MIG instance" in cordons.problems[0]
    assert "not a GPU UUID" in cordons.problems[1]
    assert "is empty" in cordons.problems[2]


@pytest.mark.parametrize("value", [None, "", "  "])
def test_absent_or_blank_cordons_nothing(value: str | None) -> None:
    """No annotation, or a blank one, cordons no GPU and reports nothing."""
    assert parse_cordons(value) == parse_cordons(None)
    assert not parse_cordons(value).uuids


def test_format_round_trips_in_canonical_form() -> None:
    """Formatting writes each UUID once, canonical and sorted, and parses back to the same set."""
    text = format_cordons([UPPER, LOWER])
    assert text == LOWER
    assert parse_cordons(text).uuids == {canonical_gpu_uuid(UPPER)}


def test_unknown_lists_uuids_not_on_the_node() -> None:
    """Cordoned UUIDs that match no GPU of the node are listed for the operator."""
    other = "GPU-11111111-2222-3333-4444-555555555555"
    assert parse_cordons(f"{UPPER},{other}").unknown([LOWER]) == (other,)
