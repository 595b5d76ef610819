"""What the node says about its driver and its GPUs' power, read through `NvmlReader`.

These facts go into the GpuTopology status (`driver_version`, `cuda_driver_version`,
`gpu_power`), the node's labels (`node_agent.loop.node_labels`) and the power-limit decisions
(`node_agent.loop.power`). Reading them never raises: what NVML will not tell (not supported, no
permission, a GPU that stopped answering) is unknown ("" or no entry), and the reason is kept
in `problems` for the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from node_agent.sources.nvml_reader import NvmlError, NvmlReader, PowerLimits, parse_cuda_version


@dataclass(frozen=True, slots=True)
class DriverReading:
    """The NVIDIA driver's version ("550.54.15") and the CUDA version it runs ("12.4"); "" unknown."""

    driver_version: str = ""
    cuda_driver_version: str = ""
    problems: tuple[str, ...] = ()


def read_driver(reader: NvmlReader | None) -> DriverReading:
    """The driver facts; unknown without NVML or when NVML cannot say."""
    if reader is None:
        return DriverReading()
    problems: list[str] = []
    driver = cuda = ""
    try:
        driver = reader.driver_version().strip()
    except NvmlError as exc:
        problems.append(f"driver version unknown: {exc}")
    try:
        cuda = reader.cuda_driver_version().strip()
    except NvmlError as exc:
        problems.append(f"CUDA driver version unknown: {exc}")
    if cuda and parse_cuda_version(cuda) is None:
        problems.append(f"CUDA driver version {cuda!r} is not MAJOR.MINOR; published as unknown")
        cuda = ""
    return DriverReading(driver, cuda, tuple(problems))


@dataclass(frozen=True, slots=True)
class PowerReading:
    """Each GPU's power limits by index (GPUs whose limit NVML would not tell are left out)."""

    limits: tuple[tuple[int, PowerLimits], ...] = ()
    problems: tuple[str, ...] = ()

    def of(self, index: int) -> PowerLimits | None:
        return next((p for i, p in self.limits if i == index), None)


def read_power(reader: NvmlReader | None, indices: Iterable[int]) -> PowerReading:
    """The power limits of the GPUs `indices`, in that order."""
    if reader is None:
        return PowerReading()
    limits: list[tuple[int, PowerLimits]] = []
    problems: list[str] = []
    for index in indices:
        try:
            found = reader.power_limits(index)
        except NvmlError as exc:
            problems.append(f"power limits of GPU {index} unknown: {exc}")
            continue
        if found.known:
            limits.append((index, found))
    return PowerReading(tuple(limits), tuple(problems))
