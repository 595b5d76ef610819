"""An in-memory cluster of named hardware for the extender's tests (builders: `tests.support`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contract.gpu_topology import as_published
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.snapshot import NodeFacts
from tests.support.machines import hgx_h100, rtx3090_two_socket


@pytest.fixture
def config() -> ExtenderConfig:
    # These tests exercise filter and prioritize as a pair; deciding the node in filter (the
    # built-in default) is covered by tests/extender/test_node_decision.py.
    return ExtenderConfig(decide_node=False)


@pytest.fixture
def cluster(config: ExtenderConfig) -> InMemoryCluster:
    c = InMemoryCluster(config)
    c.add_node(NodeFacts("nv-node"), as_published("nv-node", hgx_h100()))
    c.add_node(NodeFacts("pcie-node"), as_published("pcie-node", rtx3090_two_socket()))
    c.add_node(NodeFacts("bare-node"), None)
    return c


@pytest.fixture
def service(config: ExtenderConfig, cluster: InMemoryCluster) -> Iterator[ExtenderService]:
    svc = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(svc), lambda: True)
    yield svc
