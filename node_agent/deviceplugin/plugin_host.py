"""The kubelet device plugins as the agent runs them.

`DevicePluginHost` builds the plugins (`node_agent.deviceplugin`) from the agent's discovered
topology and keeps them in step with it:

- the inventory (what is offered) comes from the topology; when a rediscovery changes it (a
  GPU replaced, MIG reconfigured) the plugins are restarted on the new inventory, resyncing
  what was handed out from the pods' consumed annotations;
- GPUs that are unhealthy or cordoned are advertised Unhealthy, with every MIG instance
  carved from them, so the kubelet stops admitting pods onto them;
- the allocation counters carry over restarts and are read by the metrics at scrape time.

`install_shim` copies the framework shim (node_agent/sharing/shim) to the host directory the plugin
mounts into containers given a GPU share; `prepare_shim` does so for the agent, leaving the
shim out (logged) when the directory cannot be written.
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from contract.handoff import NodeHolds
from contract.resources import DEFAULT_UNITS_PER_GPU, ResourceNames
from node_agent.deviceplugin.broker import AllocationBroker, BrokerCounters
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.inventory import Inventory
from node_agent.deviceplugin.record_store import PodRecordStore
from node_agent.deviceplugin.server import DeviceHealth, DevicePlugins, PluginConfig, start_device_plugins
from node_agent.health import GpuHealth
from node_agent.metrics import DevicePluginStats
from node_agent.sharing.host_files import install_file
from topology.model import NodeTopology

log = logging.getLogger(__name__)

SHIM_PACKAGE = "node_agent.sharing.shim"
SHIM_FILES = ("sitecustomize.py", "linkpack_shim.py")


def install_shim(target: str | Path) -> Path:
    """Copy the shim files into `target` (created if missing). Each file is replaced atomically
    and only when it differs, so a container starting meanwhile never imports half a file.
    Raises OSError when the directory cannot be written."""
    directory = Path(target)
    directory.mkdir(parents=True, exist_ok=True)
    source = importlib.resources.files(SHIM_PACKAGE)
    for name in SHIM_FILES:
        install_file(directory / name, source.joinpath(name).read_bytes())
    return directory


def prepare_shim(directory: str | None) -> str | None:
    """Copy the framework shim to `directory` for the kubelet to mount; None (and containers
    get no shim) when there is no directory or it cannot be written."""
    if directory is None:
        return None
    try:
        install_shim(directory)
    except OSError as exc:
        log.error("cannot install the framework shim in %s, shares go without it: %s", directory, exc)
        return None
    return directory


def unavailable_devices(topology: NodeTopology, health: Iterable[GpuHealth]) -> frozenset[str]:
    """GPU UUIDs of unhealthy or cordoned GPUs, and the MIG UUIDs carved from those GPUs."""
    out = {h.uuid for h in health if not h.usable and h.uuid}
    for gpu in topology.gpus:
        if gpu.uuid in out:
            out.update(m.uuid for m in gpu.mig_devices if m.uuid)
    return frozenset(out)


@dataclass(frozen=True)
class DevicePluginSettings:
    plugin: PluginConfig = field(default_factory=PluginConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    units_per_gpu: int = DEFAULT_UNITS_PER_GPU
    resources: ResourceNames = field(default_factory=ResourceNames)
    #: whether MPS serves the node now, asked at each share handout (None: the pipe directory exists)
    mps_ready: Callable[[], bool] | None = None


class DevicePluginHost:
    """The running device plugins of this node; `start`, then `update` after every health or
    topology change, `stop` at the end. Thread-safe."""

    def __init__(
        self,
        settings: DevicePluginSettings,
        store: PodRecordStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._health = DeviceHealth()
        self._counters = BrokerCounters()  # one set for the host's life, across restarts
        self._registrations = 0  # of plugins already stopped
        self._plugins: DevicePlugins | None = None
        self._inventory: Inventory | None = None
        self._topology: NodeTopology | None = None

    @property
    def plugins(self) -> DevicePlugins | None:
        return self._plugins

    @property
    def counters(self) -> BrokerCounters:
        """The allocation counters, one set for the host's life (they carry over restarts)."""
        return self._counters

    def start(self, topology: NodeTopology, health: Iterable[GpuHealth]) -> bool:
        """Serve this topology's devices; False (logged) when they cannot be served."""
        with self._lock:
            self._health.set_unhealthy(unavailable_devices(topology, health))
            self._topology = topology
            return self._start(topology)

    def update(self, topology: NodeTopology, health: Iterable[GpuHealth]) -> None:
        """Advertise the current health; restart the plugins when the offered devices changed."""
        with self._lock:
            self._health.set_unhealthy(unavailable_devices(topology, health))
            if topology is self._topology:
                return
            self._topology = topology
            inventory = self._build_inventory(topology)
            if inventory is None or inventory == self._inventory:
                return
            log.warning("the GPUs offered to the kubelet changed; restarting the device plugins")
            self._stop()
            self._start(topology, inventory)

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def drain(self, publish: Callable[[], None], timeout_s: float = 15.0, at_least_s: float = 2.0) -> None:
        """Before stopping: report that no new pods are taken, `publish` that, and wait until the
        pods already bound here are admitted by the kubelet (so none meets a missing plugin)."""
        plugins = self._plugins
        if plugins is None:
            return
        plugins.broker.begin_drain()
        publish()
        if not plugins.broker.wait_admitted(timeout_s, at_least_s):
            log.warning("stopping the device plugins with pods bound here not yet admitted")

    def holds(self) -> NodeHolds | None:
        """What the kubelet holds of our devices, as last reported (`contract.handoff`)."""
        plugins = self._plugins
        return plugins.broker.holds() if plugins is not None else None

    def stats(self) -> DevicePluginStats:
        with self._lock:
            plugins = self._plugins
            c = self._counters
            return DevicePluginStats(
                allocations=c.allocations,
                refusals=c.refusals,
                id_mismatches=c.id_mismatches,
                enforcement_disagreements=c.enforcement_disagreements,
                fallbacks=tuple(sorted(c.fallbacks.items())),
                applied=tuple(sorted(c.applied.items())),
                swaps=c.swaps,
                unresolved=c.unresolved,
                adopted=c.adopted,
                write_failures=c.write_failures,
                resources=len(plugins.resources) if plugins else 0,
                registrations=self._registrations + (plugins.registrations if plugins else 0),
            )

    # ------------------------------------------------------------------ under the lock

    def _build_inventory(self, topology: NodeTopology) -> Inventory | None:
        try:
            inventory = Inventory.from_topology(
                topology, self.settings.units_per_gpu, self.settings.resources
            )
        except ValueError as exc:
            log.error("cannot offer this node's GPUs to the kubelet: %s", exc)
            return None
        if len(inventory.gpus) < topology.gpu_count:
            log.warning(
                "%d of %d GPUs have no UUID and are not offered to the kubelet",
                topology.gpu_count - len(inventory.gpus),
                topology.gpu_count,
            )
        return inventory

    def _start(self, topology: NodeTopology, inventory: Inventory | None = None) -> bool:
        inventory = inventory or self._build_inventory(topology)
        if inventory is None:
            return False
        self._inventory = inventory
        if not inventory.resources:
            log.warning("no GPU to offer to the kubelet; device plugins not started")
            return False
        plugin_dir = Path(self.settings.plugin.plugin_dir)
        if not plugin_dir.is_dir():
            log.error("device plugins not started: %s is not a directory (is a kubelet here?)", plugin_dir)
            return False
        broker = AllocationBroker(
            inventory,
            self._store,
            self.settings.sharing,
            clock=self._clock,
            mps_ready=self.settings.mps_ready,
        )
        broker.counters = self._counters
        try:
            self._plugins = start_device_plugins(broker, self.settings.plugin, self._health)
        except Exception as exc:
            log.error("device plugins not started: %s", exc)
            return False
        log.info("device plugins serving %s from %s", ", ".join(self._plugins.resources), plugin_dir)
        return True

    def _stop(self) -> None:
        plugins, self._plugins = self._plugins, None
        if plugins is not None:
            plugins.stop()
            self._registrations += plugins.registrations
