"""The golden extender payloads in tests/extender/golden/ are what the real kube-scheduler sends.

Run with LINKPACK_CAPTURE_GOLDEN=1 to capture them again from the pinned scheduler; otherwise the
live bodies must have exactly the goldens' shape (same keys at every level, same value types).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.controlplane import ControlPlane, delete_fake_node, render_scheduler_config, wait_for
from tests.cluster.noop_extender import NoopExtender

pytestmark = pytest.mark.cluster
# The pod and node here make the golden payloads: written out literally (resource names too) so the
# captured bodies depend on nothing but this file.
GOLDEN = Path(__file__).resolve().parents[1] / "extender" / "golden"


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def test_golden_payloads_match_what_the_scheduler_sends(
    linkpack_crd: ControlPlane, cluster_namespace: str
) -> None:
    cp = linkpack_crd
    nodes = ("golden-a", "golden-b")
    for node in nodes:
        cp.create_fake_node(node, {"nvidia.com/gpu": "8", "nvidia.com/gpu.shared": "800"})
    core: Any = client.CoreV1Api(cp.api_client())
    try:
        with NoopExtender(cp.api_client()) as extender:
            cp.start_scheduler(render_scheduler_config(extender.url, cp.kubeconfig_path))
            try:
                pod = {
                    "metadata": {"name": "golden-pod", "labels": {"app": "train"}},
                    "spec": {
                        "schedulerName": "linkpack",
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.invalid/trainer:1",
                                "resources": {
                                    "limits": {"nvidia.com/gpu": "2"},
                                    "requests": {"nvidia.com/gpu": "2"},
                                },
                            }
                        ],
                    },
                }
                core.create_namespaced_pod(cluster_namespace, pod)
                wait_for(
                    lambda: core.read_namespaced_pod("golden-pod", cluster_namespace).spec.node_name,
                    60,
                    "the golden pod bound",
                )
            finally:
                cp.stop_scheduler()
            calls = {c.verb: c.body for c in extender.calls}
    finally:
        for node in nodes:
            delete_fake_node(cp.api_client(), node)
    assert set(calls) == {"filter", "prioritize", "bind"}
    for verb, body in calls.items():
        path = GOLDEN / f"{verb}.json"
        if os.environ.get("LINKPACK_CAPTURE_GOLDEN"):
            path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
        golden = json.loads(path.read_text())
        assert _shape(body) == _shape(golden), f"{verb} body changed shape"
