"""The kubelet device-plugin gRPC adapter (API v1beta1): the only module in node_agent importing grpc.

One plugin server per resource, each on its own unix socket in the kubelet's device-plugin
directory, registered with the kubelet at `kubelet.sock`. A watcher thread re-registers when
`kubelet.sock` is recreated (kubelet restart) and restarts a server whose socket was removed.
Requests are translated to `AllocationBroker` calls and back; nothing is decided here.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from node_agent.deviceplugin.broker import AllocationBroker, AllocationRefused
from node_agent.deviceplugin.container_spec import ContainerSpec
from node_agent.deviceplugin.inventory import HEALTHY, UNHEALTHY, AdvertisedDevice
from node_agent.deviceplugin.paths import (
    DEFAULT_PLUGIN_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
    KUBELET_SOCKET_NAME,
)
from node_agent.deviceplugin.reconcile import KubeletAssignment
from node_agent.deviceplugin.record_store import RecordStoreError

log = logging.getLogger(__name__)

# The generated stubs (`make proto`) are untyped; loaded by name they are `Any` to the type checker.
_GENERATED = "node_agent.deviceplugin._generated"
api: Any = importlib.import_module(f"{_GENERATED}.deviceplugin_pb2")
api_grpc: Any = importlib.import_module(f"{_GENERATED}.deviceplugin_pb2_grpc")
podres: Any = importlib.import_module(f"{_GENERATED}.podresources_pb2")
podres_grpc: Any = importlib.import_module(f"{_GENERATED}.podresources_pb2_grpc")
Message = Any  # a generated protobuf message

API_VERSION = "v1beta1"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Where the plugins live and how often they look around."""

    plugin_dir: str = DEFAULT_PLUGIN_DIR
    pod_resources_socket: str | None = DEFAULT_POD_RESOURCES_SOCKET  # None: no reconciliation with it
    socket_prefix: str = "linkpack"
    poll_interval_s: float = 0.2  # kubelet.sock and own sockets (re-register fast after a kubelet restart)
    reconcile_interval_s: float = 2.0  # release departed pods, check and report what the kubelet holds
    register_timeout_s: float = 10.0

    def socket_name(self, resource: str) -> str:
        return f"{self.socket_prefix}-{resource.replace('/', '_')}.sock"


class DeviceHealth:
    """Which GPU / MIG UUIDs are unhealthy now; ListAndWatch streams wait on it."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._unhealthy: frozenset[str] = frozenset()
        self._version = 0

    def set_unhealthy(self, uuids: Iterable[str]) -> None:
        new = frozenset(uuids)
        with self._changed:
            if new != self._unhealthy:
                self._unhealthy = new
                self._version += 1
                self._changed.notify_all()

    def current(self) -> tuple[int, frozenset[str]]:
        with self._changed:
            return self._version, self._unhealthy

    def wait_for_change(self, seen: int, timeout_s: float) -> tuple[int, frozenset[str]]:
        with self._changed:
            self._changed.wait_for(lambda: self._version != seen, timeout=timeout_s)
            return self._version, self._unhealthy


class _DevicePluginService:
    """The DevicePlugin service of one resource."""

    def __init__(
        self, resource: str, broker: AllocationBroker, health: DeviceHealth, stopped: threading.Event
    ):
        self._resource = resource
        self._broker = broker
        self._health = health
        self._stopped = stopped

    def GetDevicePluginOptions(self, request: Message, context: grpc.ServicerContext) -> Message:
        return plugin_options()

    def ListAndWatch(self, request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        version, unhealthy = self._health.current()
        sent = self._broker.inventory.devices(self._resource, unhealthy)
        yield _device_list(sent)
        while not self._stopped.is_set() and context.is_active():
            version, unhealthy = self._health.wait_for_change(version, timeout_s=0.5)
            devices = self._broker.inventory.devices(self._resource, unhealthy)
            if devices != sent:
                sent = devices
                yield _device_list(devices)

    def GetPreferredAllocation(self, request: Message, context: grpc.ServicerContext) -> Message:
        responses = []
        for req in request.container_requests:
            try:
                ids = self._broker.preferred(
                    self._resource,
                    list(req.available_deviceIDs),
                    list(req.must_include_deviceIDs),
                    req.allocation_size,
                )
            except Exception:
                log.exception("GetPreferredAllocation for %s failed", self._resource)
                context.abort(grpc.StatusCode.INTERNAL, "linkpack device plugin: internal error")
            responses.append(api.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Message, context: grpc.ServicerContext) -> Message:
        responses = []
        for req in request.container_requests:
            try:
                spec = self._broker.allocate(self._resource, list(req.devices_ids))
            except AllocationRefused as refused:
                log.warning("refused Allocate of %s %s: %s", list(req.devices_ids), self._resource, refused)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"linkpack: {refused}")
            except Exception:
                log.exception("Allocate for %s failed", self._resource)
                context.abort(grpc.StatusCode.INTERNAL, "linkpack device plugin: internal error")
            responses.append(container_response(spec))
        return api.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Message, context: grpc.ServicerContext) -> Message:
        return api.PreStartContainerResponse()


def plugin_options() -> Message:
    return api.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def container_response(spec: ContainerSpec) -> Message:
    return api.ContainerAllocateResponse(
        envs=dict(spec.envs),
        mounts=[
            api.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in spec.mounts
        ],
    )


def _device_list(devices: Sequence[AdvertisedDevice]) -> Message:
    return api.ListAndWatchResponse(
        devices=[
            api.Device(
                ID=d.id,
                health=HEALTHY if d.healthy else UNHEALTHY,
                topology=api.TopologyInfo(nodes=[api.NUMANode(ID=d.numa_node)])
                if d.numa_node is not None
                else None,
            )
            for d in devices
        ]
    )


class _PluginEndpoint:
    """One resource's gRPC server on its unix socket, and its registration with the kubelet."""

    def __init__(self, resource: str, broker: AllocationBroker, health: DeviceHealth, config: PluginConfig):
        self.resource = resource
        self.socket_name = config.socket_name(resource)
        self.socket_path = Path(config.plugin_dir) / self.socket_name
        self._broker = broker
        self._health = health
        self._config = config
        self._server: Any = None
        self._stopped = threading.Event()

    def start(self) -> None:
        self.stop()
        self.socket_path.unlink(missing_ok=True)
        self._stopped = threading.Event()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"dp-{self.resource}")
        )
        service = _DevicePluginService(self.resource, self._broker, self._health, self._stopped)
        api_grpc.add_DevicePluginServicer_to_server(service, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        log.info("serving %s on %s", self.resource, self.socket_path)

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=1.0).wait()
            self._server = None

    def socket_present(self) -> bool:
        try:
            return stat.S_ISSOCK(self.socket_path.stat().st_mode)
        except OSError:
            return False

    def register(self, kubelet_socket: Path) -> None:
        request = api.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource,
            options=plugin_options(),
        )
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            api_grpc.RegistrationStub(channel).Register(request, timeout=self._config.register_timeout_s)
        log.info("registered %s with the kubelet", self.resource)


class KubeletPodResources:
    """Client of the kubelet's pod-resources API (v1 List): which container holds which device IDs
    of the resources we serve (`served`)."""

    def __init__(self, socket_path: str, served: Callable[[str], bool], timeout_s: float = 5.0) -> None:
        self._target = f"unix://{socket_path}"
        self._served = served
        self._timeout_s = timeout_s

    def reachable(self) -> bool:
        """Whether the kubelet listens on its pod-resources socket (a connect, no call)."""
        path = self._target.removeprefix("unix://")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            try:
                probe.connect(path)
            except OSError:
                return False
        return True

    def list(self) -> tuple[KubeletAssignment, ...]:
        """Our resources' assignments; raises OSError when the kubelet cannot be asked."""
        try:
            with grpc.insecure_channel(self._target) as channel:
                stub = podres_grpc.PodResourcesListerStub(channel)
                answer = stub.List(podres.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise OSError(f"pod-resources List failed: {exc.code()}") from exc
        return tuple(
            KubeletAssignment(p.namespace, p.name, c.name, d.resource_name, tuple(d.device_ids))
            for p in answer.pod_resources
            for c in p.containers
            for d in c.devices
            if self._served(d.resource_name)
        )


class DevicePlugins:
    """All of this node's plugin servers, registered with the kubelet and kept registered."""

    def __init__(self, broker: AllocationBroker, config: PluginConfig, health: DeviceHealth | None = None):
        self.broker = broker
        self.config = config
        self.health = health or DeviceHealth()
        self.kubelet_socket = Path(config.plugin_dir) / KUBELET_SOCKET_NAME
        self.registrations = 0
        self._endpoints = [
            _PluginEndpoint(r, broker, self.health, config) for r in broker.inventory.resources
        ]
        self._pod_resources = (
            KubeletPodResources(config.pod_resources_socket, broker.inventory.serves)
            if config.pod_resources_socket
            else None
        )
        if self._pod_resources is not None:
            broker.kubelet_account = self._pod_resources.list
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(e.resource for e in self._endpoints)

    def set_unhealthy(self, uuids: Iterable[str]) -> None:
        """GPU or MIG UUIDs now unhealthy (the complete set); every ListAndWatch stream is told."""
        self.health.set_unhealthy(uuids)

    def start(self) -> None:
        try:
            for endpoint in self._endpoints:
                endpoint.start()
        except BaseException:
            for endpoint in self._endpoints:  # none is left serving when one cannot start
                endpoint.stop()
                endpoint.socket_path.unlink(missing_ok=True)
            raise
        self._thread = threading.Thread(target=self._watch, name="linkpack-deviceplugin-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for endpoint in self._endpoints:
            endpoint.stop()
            endpoint.socket_path.unlink(missing_ok=True)

    def reconcile_now(self) -> None:
        """Release departed pods and check handouts against the kubelet's pod-resources account
        (when configured; the broker asks it right after listing the pods)."""
        try:
            self.broker.reconcile()
        except RecordStoreError as exc:
            log.warning("reconcile skipped, cannot list pods: %s", exc)

    def _watch(self) -> None:
        seen_kubelet: tuple[int, int] | None = None
        unregistered = {e.resource for e in self._endpoints}
        since_reconcile = 0.0
        while not self._stop.is_set():
            try:
                kubelet = _socket_identity(self.kubelet_socket)
                if kubelet is not None and kubelet != seen_kubelet:
                    log.info("kubelet socket %s appeared or was recreated", self.kubelet_socket)
                    unregistered = set(self.resources)
                seen_kubelet = kubelet
                for endpoint in self._endpoints:
                    if not endpoint.socket_present():
                        log.warning("socket of %s was removed; restarting its server", endpoint.resource)
                        endpoint.start()
                        unregistered.add(endpoint.resource)
                if kubelet is not None:
                    unregistered = self._register(unregistered)
                self.broker.registered = kubelet is not None and not unregistered
                if self._pod_resources is not None and not self._pod_resources.reachable():
                    self.broker.kubelet_unreachable()  # take no new pods until it answers again
                since_reconcile += self.config.poll_interval_s
                if since_reconcile >= self.config.reconcile_interval_s:
                    since_reconcile = 0.0
                    self.reconcile_now()
            except Exception:
                log.exception("device plugin watcher step failed; will retry")
            self._stop.wait(self.config.poll_interval_s)

    def _register(self, pending: set[str]) -> set[str]:
        still: set[str] = set()
        for endpoint in self._endpoints:
            if endpoint.resource not in pending:
                continue
            try:
                endpoint.register(self.kubelet_socket)
                self.registrations += 1
            except grpc.RpcError as exc:
                log.warning("registering %s failed (%s); will retry", endpoint.resource, exc.code())
                still.add(endpoint.resource)
        return still


def _socket_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


def start_device_plugins(
    broker: AllocationBroker, config: PluginConfig | None = None, health: DeviceHealth | None = None
) -> DevicePlugins:
    """Resync the broker from the API, start one plugin server per resource, register them with the
    kubelet (now, or as soon as its socket appears) and keep them registered. Call `stop()` to end."""
    try:
        broker.resync()
    except RecordStoreError as exc:
        log.warning("cannot read this node's pods at start; starting with nothing handed out: %s", exc)
    plugins = DevicePlugins(broker, config or PluginConfig(), health)
    plugins.start()
    return plugins
