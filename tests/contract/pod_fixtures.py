"""Pod manifests in the API server's shape, each with the effective request Kubernetes gives it.

Both sides (the extender's request reader and the node agent's device plugin) are run over
these in `test_same_answer.py`; the expected amounts follow the kubelet's own rule. Containers ask
with limits alone, as a user writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.pods import Amount, pod_manifest
from tests.support.pods import container as any_container
from tests.support.resources import GPU, MEMORY, SHARED, mig_resource

MIG = mig_resource("1g.10gb")


def container(
    name: str, restart: str = "", *, gpu: Amount = 0, shared: Amount = 0, memory: Amount = 0, mig: Amount = 0
) -> dict[str, Any]:
    """A container asking with limits alone; `restart="Always"` makes an init container a sidecar."""
    return any_container(
        name,
        gpus=gpu,
        units=shared,
        memory=memory,
        mig={"1g.10gb": mig} if mig else None,
        limits_only=True,
        image="cuda",
        restart_policy=restart,
    )


def pod(
    name: str, containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A pending pod already on node-a, with a uid and resourceVersion as the API server gives."""
    return pod_manifest(
        name,
        containers=containers,
        init_containers=init,
        uid=f"uid-{name}",
        resource_version="7",
        node="node-a",
    )


@dataclass(frozen=True)
class Case:
    description: str
    manifest: dict[str, Any]
    effective: dict[str, int]


CASES = (
    Case(
        "a plain pod asks for what its one container asks",
        pod("plain", [container("main", gpu="2")]),
        {GPU: 2},
    ),
    Case(
        "app containers add up",
        pod("two-apps", [container("a", gpu="1"), container("b", gpu="2")]),
        {GPU: 3},
    ),
    Case(
        "a plain init container larger than the app sum sets the request",
        pod("big-init", [container("main", gpu="1")], init=[container("prep", gpu="4")]),
        {GPU: 4},
    ),
    Case(
        "a plain init container smaller than the app sum changes nothing",
        pod("small-init", [container("main", gpu="3")], init=[container("prep", gpu="1")]),
        {GPU: 3},
    ),
    Case(
        "a sidecar's GPU counts for the pod's life, beside the app's",
        pod("sidecar", [container("main", gpu="1")], init=[container("proxy", "Always", gpu="1")]),
        {GPU: 2},
    ),
    Case(
        "a sidecar started before a plain init container runs beside it",
        pod(
            "sidecar-before-init",
            [container("main")],
            init=[container("proxy", "Always", gpu="1"), container("prep", gpu="2")],
        ),
        {GPU: 3},
    ),
    Case(
        "a sidecar started after a plain init container does not add to it",
        pod(
            "init-before-sidecar",
            [container("main")],
            init=[container("prep", gpu="2"), container("proxy", "Always", gpu="1")],
        ),
        {GPU: 2},
    ),
    Case(
        "a MIG slice asked by one container",
        pod("mig", [container("main", mig="1")]),
        {MIG: 1},
    ),
    Case(
        "a share: units and memory from the same container",
        pod("share", [container("main", shared="25", memory="10240")]),
        {SHARED: 25, MEMORY: 10240},
    ),
    Case(
        "shares of several containers add up per resource",
        pod(
            "multi-share",
            [container("a", shared="10", memory="4096"), container("b", shared="20", memory="2048")],
        ),
        {SHARED: 30, MEMORY: 6144},
    ),
    Case(
        "quantities with suffixes as the API server may write them",
        pod("suffixes", [container("main", shared="1", memory="1Ki")]),
        {SHARED: 1, MEMORY: 1024},
    ),
    Case("a pod without GPUs asks for nothing", pod("cpu-only", [container("main")]), {}),
)
