"""The GpuTopology status's node facts: driver and CUDA versions, power limits, label conflicts."""

from __future__ import annotations

import re

import pytest

from contract.gpu_topology import GpuPower, GpuTopologyError, TopologyStatus, decode_status, encode_status

CONFLICT = (
    "node label nvidia.com/gpu.product='Tesla-V100-SXM2-32GB' was not set by the node agent, "
    "which would set 'V100-SXM2-32GB'; left alone"
)


def _status() -> TopologyStatus:
    return TopologyStatus(
        gpu_count=2,
        driver_version="550.54.15",
        cuda_driver_version="12.4",
        gpu_power=(GpuPower(0, 400, 100, 400), GpuPower(1, 275, 100, 400)),
        label_conflicts=(CONFLICT,),
    )


@pytest.mark.timeout(30)
def test_node_facts_round_trip_under_their_wire_names() -> None:
    """Driver, CUDA version, power limits and label conflicts are written as the CRD names them and read back."""
    doc = encode_status(_status())
    assert doc["driver"] == {"version": "550.54.15", "cudaVersion": "12.4"}
    assert doc["gpuPower"][1] == {"index": 1, "limitW": 275, "minW": 100, "maxW": 400}
    assert doc["labelConflicts"] == [CONFLICT]
    assert decode_status(doc) == _status()


@pytest.mark.timeout(30)
def test_a_status_of_an_older_agent_has_no_conflicts() -> None:
    """A status written before label conflicts existed reads as none."""
    doc = encode_status(_status())
    del doc["labelConflicts"]
    assert decode_status(doc).label_conflicts == ()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("status", "path"),
    [
        ({"labelConflicts": "one"}, "status.labelConflicts"),
        ({"labelConflicts": [1]}, "status.labelConflicts[0]"),
        ({"gpuPower": [{"index": 0}]}, "status.gpuPower[0]"),
        ({"driver": {"cudaVersion": 12.4}}, "status.driver.cudaVersion"),
    ],
)
def test_malformed_node_facts_name_the_field(status: dict[str, object], path: str) -> None:
    """A malformed conflict list, power entry or driver version is an error naming its field."""
    with pytest.raises(GpuTopologyError, match=re.escape(f"GpuTopology node-a: {path}")):
        decode_status(status, "node-a")
