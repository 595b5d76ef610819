"""The extender answers the exact bodies the real kube-scheduler sent (captured into golden/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract.gpu_topology import as_published
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.snapshot import NodeFacts
from tests.support.machines import hgx_h100, rtx3090_two_socket

GOLDEN = Path(__file__).parent / "golden"


def _golden(verb: str) -> dict[str, Any]:
    return dict(json.loads((GOLDEN / f"{verb}.json").read_text()))


def test_captured_filter_prioritize_and_bind_are_served() -> None:
    config = ExtenderConfig(decide_node=False)  # the captured payloads are of filter + prioritize
    cluster = InMemoryCluster(config)
    cluster.add_node(NodeFacts("golden-a"), as_published("golden-a", rtx3090_two_socket("a")))
    cluster.add_node(NodeFacts("golden-b"), as_published("golden-b", hgx_h100("b")))
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    filter_body = _golden("filter")
    cluster.create_pod(filter_body["Pod"])

    filtered = service.filter(filter_body)
    assert sorted(filtered["NodeNames"]) == ["golden-a", "golden-b"]
    assert filtered["Error"] == ""

    scores = service.prioritize(_golden("prioritize"))
    assert {s["Host"] for s in scores} == {"golden-a", "golden-b"}
    assert (
        dict((s["Host"], s["Score"]) for s in scores)["golden-b"]
        >= dict((s["Host"], s["Score"]) for s in scores)["golden-a"]
    )

    assert service.bind(_golden("bind")) == {"Error": ""}
