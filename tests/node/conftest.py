"""Fixtures for tests on a real node.

- `kubelet_binary` (session): the kubelet of the pinned release, built once into the cache
  (`tests.cluster.binaries.build_kubelet`; about 6 minutes on 2 cores the first time).
- `real_node` (session): one `RealNode` (containerd + kubelet, node `real-node`) on the
  session's control plane, shared by every test of the session.

Tests here need root (runc, mounts, the fixed /var/lib/kubelet/device-plugins); without it
they are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.binaries import build_kubelet
from tests.cluster.controlplane import ControlPlane
from tests.node.packages import ensure_node_packages
from tests.node.real_node import NODE_NAME, RealNode


@pytest.fixture(scope="session")
def kubelet_binary(request: pytest.FixtureRequest) -> Path:
    if os.geteuid() != 0:
        pytest.skip("a real node runs containers with runc and uses /var/lib/kubelet: needs root")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    quiet = capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext()
    with quiet:
        ensure_node_packages()
        return build_kubelet()


@pytest.fixture(scope="session")
def real_node(linkpack_crd: ControlPlane, kubelet_binary: Path) -> Iterator[RealNode]:
    node = RealNode(linkpack_crd, kubelet_binary, NODE_NAME)
    node.start()
    try:
        yield node
    finally:
        node.stop()
