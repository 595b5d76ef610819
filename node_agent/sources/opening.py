"""Which sources a run of the agent reads: a simulated machine, or real NVML and `nvidia-smi`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from node_agent.sources.nvml_pynvml import PynvmlReader
from node_agent.sources.nvml_reader import NvmlReader, NvmlUnavailable
from node_agent.sources.nvml_simulated import SimulatedNvml
from node_agent.sources.smi_runner import SmiError, run_topo_matrix
from topology.catalog import MACHINES, topo_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeSources:
    """The NVML reader (None without NVML), the simulation behind it if any, and a function
    giving `nvidia-smi topo -m` text (None when there is none)."""

    reader: NvmlReader | None
    simulated: SimulatedNvml | None
    topo_text: Callable[[], str | None]


def open_sources(
    simulate: str | None,
    node_name: str,
    *,
    use_smi: bool,
    nvidia_smi: str,
    simulate_driver: str | None = None,
    simulate_cuda: str | None = None,
    simulate_mig: Mapping[int, Sequence[str]] | None = None,
) -> NodeSources:
    """A simulated machine (catalog name or `topo -m` file) when `simulate` is set, else the real
    NVML (when it loads) and `nvidia-smi` (unless `use_smi` is off). Raises CatalogError and
    OSError for a simulated machine that cannot be loaded. `simulate_driver` / `simulate_cuda`
    replace the simulated driver's version and the CUDA version it runs; `simulate_mig` starts
    those simulated GPUs in MIG mode with those instances (MigLayoutError when one cannot)."""
    if simulate is not None:
        versions: dict[str, str] = {}
        if simulate_driver is not None:
            versions["driver"] = simulate_driver
        if simulate_cuda is not None:
            versions["cuda_version"] = simulate_cuda
        sim = SimulatedNvml.from_machine(simulate, node_name=node_name, mig_layout=simulate_mig, **versions)
        text = simulated_topo_text(simulate)
        return NodeSources(sim, sim, lambda: text)
    reader: NvmlReader | None = None
    try:
        reader = PynvmlReader.open()
    except NvmlUnavailable as exc:
        log.warning("NVML unavailable, relying on nvidia-smi topo -m: %s", exc)

    def topo_text() -> str | None:
        if not use_smi:
            return None
        try:
            return run_topo_matrix(nvidia_smi)
        except SmiError as exc:
            log.warning("%s", exc)
            return None

    return NodeSources(reader, None, topo_text)


def simulated_topo_text(name_or_path: str) -> str | None:
    """The `topo -m` capture behind a simulated machine, so simulate mode merges both sources."""
    profile = MACHINES.get(name_or_path)
    path = topo_dir() / profile.file if profile is not None else Path(name_or_path)
    return path.read_text() if path.is_file() else None
