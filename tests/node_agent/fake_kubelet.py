"""A fake kubelet for device-plugin tests: Registration on <dir>/kubelet.sock, over real gRPC."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from node_agent.deviceplugin._generated import deviceplugin_pb2 as api  # the kubelet's messages
from node_agent.deviceplugin._generated import deviceplugin_pb2_grpc as api_grpc
from node_agent.deviceplugin.server import PluginConfig


class FakeKubelet:
    """Registration on <dir>/kubelet.sock; records requests and checks the plugin answers."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registered: list[api.RegisterRequest] = []
        self.options: list[api.DevicePluginOptions] = []
        self._server: grpc.Server | None = None

    def Register(self, request, context):
        with grpc.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}") as channel:
            options = api_grpc.DevicePluginStub(channel).GetDevicePluginOptions(api.Empty(), timeout=5)
        self.options.append(options)
        self.registered.append(request)
        return api.Empty()

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        self._server.start()

    def restart(self) -> None:
        """What a kubelet restart looks like to a plugin: every socket removed, kubelet.sock recreated."""
        if self._server is not None:
            self._server.stop(grace=None).wait()
        for sock in self.plugin_dir.glob("*.sock"):
            sock.unlink()
        self.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()


def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def plugin_stub(plugin_dir: Path, resource: str) -> tuple[grpc.Channel, api_grpc.DevicePluginStub]:
    """A client of our plugin server for `resource` (close the channel when done)."""
    channel = grpc.insecure_channel(f"unix://{plugin_dir / PluginConfig().socket_name(resource)}")
    return channel, api_grpc.DevicePluginStub(channel)
