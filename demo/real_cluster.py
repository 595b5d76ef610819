"""The demo against a real cluster: pods are created in a namespace of their own and driven
through the extender's HTTP verbs by the demo itself (their schedulerName is served by no
scheduler, so nothing else acts on them); the extender watches the cluster as in production."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

DEMO_NAMESPACE = "linkpack-demo"
DEMO_SCHEDULER = "linkpack-demo-driver"


class RealClusterPods:
    def __init__(self, api_client: client.ApiClient, namespace: str = DEMO_NAMESPACE) -> None:
        core: Any = client.CoreV1Api(api_client)
        self._core = core
        self._namespace = namespace
        with contextlib.suppress(ApiException):
            core.create_namespace({"metadata": {"name": namespace}})

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        pod = json.loads(json.dumps(manifest))
        pod["metadata"]["namespace"] = self._namespace
        pod["metadata"].pop("uid", None)
        pod["spec"]["schedulerName"] = DEMO_SCHEDULER
        created = self._core.create_namespaced_pod(self._namespace, pod, _preload_content=False)
        return dict(json.loads(created.data))

    def pods(self) -> list[dict[str, Any]]:
        raw = self._core.list_namespaced_pod(self._namespace, _preload_content=False)
        return list(json.loads(raw.data)["items"])
