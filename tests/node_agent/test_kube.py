"""Kubernetes translation (pure) and the adapter's error wrapping, without an API server."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from node_agent.kube import (
    GROUP,
    HASH_ANNOTATION,
    MERGE_PATCH,
    PLURAL,
    VERSION,
    AgentEvent,
    KubeConflict,
    KubeError,
    KubeNotFound,
    KubernetesClusterApi,
    event_body,
    extended_requests,
    kube_error,
    pod_from_dict,
    rfc3339,
    topology_object,
)

POD = {
    "metadata": {
        "name": "train-0",
        "namespace": "ml",
        "uid": "u-1",
        "resourceVersion": "812",
        "annotations": {"linkpack.io/allocation": "{}"},
        "creationTimestamp": "2024-05-01T10:00:00Z",
    },
    "spec": {
        "nodeName": "n1",
        "containers": [
            {
                "name": "main",
                "resources": {"requests": {"linkpack.io/gpu": "2", "cpu": "4", "memory": "8Gi"}},
            },
            {
                "name": "side",
                "resources": {"limits": {"linkpack.io/gpu-memory": "1k", "nvidia.com/gpu": "1"}},
            },
        ],
    },
    "status": {"phase": "Running"},
}


def test_pod_translation_keeps_extended_requests_only():
    pod = pod_from_dict(POD)
    assert (pod.namespace, pod.name, pod.uid, pod.resource_version, pod.node_name) == (
        "ml",
        "train-0",
        "u-1",
        "812",
        "n1",
    )
    assert pod.annotations["linkpack.io/allocation"] == "{}"
    assert pod.containers[0].resources == (("linkpack.io/gpu", 2),)
    assert pod.containers[1].resources == (("linkpack.io/gpu-memory", 1000), ("nvidia.com/gpu", 1))
    assert pod.requested("linkpack.io/gpu") == 2
    assert pod.created == dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)
    assert not pod.finished


def test_requests_win_over_limits_and_odd_quantities_are_skipped():
    assert extended_requests({"limits": {"a.io/x": "4"}, "requests": {"a.io/x": "2"}}) == (("a.io/x", 2),)
    assert extended_requests({"requests": {"a.io/x": "0.5", "kubernetes.io/y": "1"}}) == ()


def test_topology_object_is_named_after_the_node_and_carries_the_hash():
    obj = topology_object("n1", {"gpus": []}, "abc", resource_version="5")
    assert obj["apiVersion"] == "linkpack.io/v1alpha1" and obj["kind"] == "GpuTopology"
    assert obj["metadata"]["name"] == "n1" and obj["metadata"]["resourceVersion"] == "5"
    assert obj["metadata"]["annotations"][HASH_ANNOTATION] == "abc"
    assert "status" not in obj


def test_event_body_is_accepted_by_the_client_model():
    now = dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=dt.UTC)
    body = event_body(AgentEvent("GpuUnhealthy", "GPU 3 XID 79", "Node", "n1", warning=True), "n1", now)
    assert body["type"] == "Warning" and body["metadata"]["namespace"] == "default"
    assert "namespace" not in body["involvedObject"]
    assert body["firstTimestamp"] == rfc3339(now) == "2024-05-01T10:00:00Z"
    model = client.CoreV1Event.from_dict(body)
    assert model is not None
    assert model.involved_object.name == "n1" and model.reason == "GpuUnhealthy"
    pod_event = event_body(AgentEvent("GpuMemoryOverShare", "x", "Pod", "p", "ml", "u-1", True), "n1", now)
    assert pod_event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ml",
        "uid": "u-1",
    }


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ApiException(status=409, reason="Conflict"), KubeConflict),
        (ApiException(status=404, reason="Not Found"), KubeNotFound),
        (ApiException(status=500, reason="Internal"), KubeError),
        (ConnectionRefusedError("refused"), KubeError),
    ],
)
def test_client_errors_become_ours(exc, kind):
    err = kube_error("patch node n1", exc)
    assert type(err) is kind and "patch node n1" in str(err)


class _Recorder:
    """Stands in for CoreV1Api / CustomObjectsApi: records calls, replays scripted results."""

    def __init__(self, results: dict[str, list[Any]]) -> None:
        self.results = results
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            outcome = self.results.get(name, [None]).pop(0) if self.results.get(name) else None
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return call


def _api(core: dict[str, list[Any]] | None = None, custom: dict[str, list[Any]] | None = None):
    api = KubernetesClusterApi(client.ApiClient(), "n1")
    api._core = _Recorder(core or {})  # type: ignore[assignment]
    api._custom = _Recorder(custom or {})  # type: ignore[assignment]
    return api


def test_put_spec_creates_then_replaces_with_the_resource_version():
    api = _api(custom={"get_cluster_custom_object": [ApiException(status=404)]})
    api.put_topology_spec("n1", {"gpus": []}, "h1")
    assert [c[0] for c in api._custom.calls] == ["get_cluster_custom_object", "create_cluster_custom_object"]
    existing = {
        "metadata": {"name": "n1", "resourceVersion": "9", "annotations": {HASH_ANNOTATION: "h1"}},
        "spec": {},
    }
    api = _api(custom={"get_cluster_custom_object": [existing]})
    api.put_topology_spec("n1", {"gpus": []}, "h2")
    name, args, _ = api._custom.calls[-1]
    assert name == "replace_cluster_custom_object"
    assert args[:4] == (GROUP, VERSION, PLURAL, "n1") and args[4]["metadata"]["resourceVersion"] == "9"


def test_put_spec_retries_on_conflict_then_gives_up():
    conflict = ApiException(status=409, reason="Conflict")
    api = _api(
        custom={
            "get_cluster_custom_object": [ApiException(status=404)] * 3,
            "create_cluster_custom_object": [conflict, conflict, conflict],
        }
    )
    with pytest.raises(KubeConflict, match="after 3 attempts"):
        api.put_topology_spec("n1", {}, "h")


def test_status_and_annotations_use_merge_patches():
    api = _api()
    api.patch_topology_status("n1", {"heartbeat": "t"})
    name, args, kwargs = api._custom.calls[0]
    assert name == "patch_cluster_custom_object_status" and args[-1] == {"status": {"heartbeat": "t"}}
    assert kwargs["_content_type"] == MERGE_PATCH
    api.patch_pod_annotations("ml", "p", {"a": "1", "b": None}, "812")
    name, args, kwargs = api._core.calls[0]
    assert args[2] == {"metadata": {"resourceVersion": "812", "annotations": {"a": "1", "b": None}}}
    assert kwargs["_content_type"] == MERGE_PATCH


def test_pod_annotation_conflict_is_a_kube_conflict():
    api = _api(core={"patch_namespaced_pod": [ApiException(status=409, reason="Conflict")]})
    with pytest.raises(KubeConflict):
        api.patch_pod_annotations("ml", "p", {"a": "1"}, "1")


def test_listing_pods_uses_the_node_field_selector_and_translates():
    api = _api(core={"list_pod_for_all_namespaces": [{"items": [POD]}]})
    pods = api.list_node_pods("n1")
    assert pods[0].name == "train-0"
    assert api._core.calls[0][2] == {"field_selector": "spec.nodeName=n1"}


def test_missing_topology_is_none_and_other_errors_raise():
    assert _api(custom={"get_cluster_custom_object": [ApiException(status=404)]}).get_topology("n1") is None
    with pytest.raises(KubeError, match="HTTP 403"):
        _api(
            custom={"get_cluster_custom_object": [ApiException(status=403, reason="Forbidden")]}
        ).get_topology("n1")


def test_events_are_sent_as_client_models():
    api = _api()
    api.emit_event(AgentEvent("GpuRecovered", "GPU 1 back", "Node", "n1"))
    name, args, _ = api._core.calls[0]
    assert name == "create_namespaced_event" and args[0] == "default"
    assert isinstance(args[1], client.CoreV1Event)


def test_bad_kubeconfig_is_a_kube_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(KubeError, match="cannot load Kubernetes credentials"):
        KubernetesClusterApi.from_config("n1", str(missing))


def test_get_pod_reads_one_pod_and_a_missing_one_is_none():
    api = _api(core={"read_namespaced_pod": [POD, ApiException(status=404, reason="Not Found")]})
    pod = api.get_pod("ml", "train-0")
    assert pod is not None and pod.uid == "u-1" and pod.resource_version == "812"
    assert api._core.calls[0][:2] == ("read_namespaced_pod", ("train-0", "ml"))
    assert api.get_pod("ml", "gone") is None
    failing = _api(core={"read_namespaced_pod": [ApiException(status=403, reason="Forbidden")]})
    with pytest.raises(KubeError, match="get pod ml/p: HTTP 403"):
        failing.get_pod("ml", "p")
