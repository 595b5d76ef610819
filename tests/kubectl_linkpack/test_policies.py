"""`kubectl linkpack policies`: every policy, valid or not, and the pods each one decides for."""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest

from kubectl_linkpack.cli import run
from tests.support.pods import pod_manifest

from .fakes import FakeReader

pytestmark = pytest.mark.timeout(30)


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_policies_list_their_rules_and_the_pods_they_decide_for() -> None:
    """A pod's annotation, its namespace's label and the cluster default each pick a policy, as
    the extender picks it; an invalid policy is listed with what is wrong; CPU pods are not counted."""
    reader = FakeReader()
    reader.policy_objects = {
        "default": policy("default", weights={"packing": 2}),
        "fabric": policy("fabric", topology={"requireNvswitch": True}, cudaVersion="12.4"),
        "broken": policy("broken", sharing={"maxSharersPerGpu": -1}),
    }
    reader.namespace_objects = {
        "research": {"metadata": {"name": "research", "labels": {"linkpack.io/policy": "fabric"}}}
    }
    reader.pod_objects = [
        pod_manifest("a", uid="uid-a", gpus=1),
        pod_manifest("b", namespace="research", uid="uid-b", gpus=1),
        pod_manifest("c", uid="uid-c", gpus=1, policy="broken"),
        pod_manifest("d", uid="uid-d", gpus=1, policy="binpack"),
        pod_manifest("cpu", uid="uid-cpu"),
    ]
    out = io.StringIO()
    args = argparse.Namespace(command="policies", units_per_gpu=None)
    assert run(args, reader, out) == 0
    lines = out.getvalue().splitlines()
    rows = {line.split()[0]: line for line in lines[1:] if not line.startswith("warning")}
    assert "1/1/2" in rows["default"] and rows["default"].endswith("ml/a")
    assert "nvswitch,cuda>=12.4" in rows["fabric"] and rows["fabric"].endswith("research/b")
    assert "INVALID" in rows["broken"] and rows["broken"].endswith("ml/c")
    assert "built-in" in rows["binpack"] and rows["binpack"].endswith("ml/d")
    assert any(line.startswith("warning: broken:") and "maxSharersPerGpu" in line for line in lines)
    assert "cpu" not in out.getvalue()


def test_policies_say_whether_they_decide_the_node() -> None:
    """The DECIDES NODE column: yes by default and for built-in policies, no with decideNode: false."""
    reader = FakeReader()
    reader.policy_objects = {
        "decides": policy("decides"),
        "mixes": policy("mixes", decideNode=False),
    }
    reader.pod_objects = [pod_manifest("a", uid="uid-a", gpus=1, policy="binpack")]
    out = io.StringIO()
    assert run(argparse.Namespace(command="policies", units_per_gpu=None), reader, out) == 0
    header, *lines = out.getvalue().splitlines()
    assert "DECIDES NODE" in header
    rows = {line.split()[0]: line.split() for line in lines if not line.startswith("warning")}
    # the last three cells: DECIDES NODE, PODS, USED BY
    assert rows["decides"][-3] == "yes" and rows["mixes"][-3] == "no" and rows["binpack"][-3] == "yes"
