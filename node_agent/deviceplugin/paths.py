"""Where the kubelet's sockets are; no gRPC here, so the agent's config can import it."""

from __future__ import annotations

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
KUBELET_SOCKET_NAME = "kubelet.sock"
