"""Attacks on the extender that must fail, against the real API server: an unauthenticated bind,
a bind with a certificate of another CA, and debug reads without an RBAC permission."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx
import pytest
from kubernetes import client

from tests.cluster.controlplane import MANIFESTS, ControlPlane, load_manifest
from tests.cluster.linkpack_env import HOSTNAME, ExtenderProcess, running_extender
from tests.support.pods import api_pod_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

NS = "linkpack-system"


@pytest.fixture(scope="module")
def guarded(linkpack_crd: ControlPlane) -> Iterator[tuple[ControlPlane, ExtenderProcess]]:
    cp = linkpack_crd
    cp.create_objects(load_manifest(MANIFESTS / "extender-access.yaml"), exist_ok=True)
    core = client.CoreV1Api(cp.api_client())
    rbac = client.RbacAuthorizationV1Api(cp.api_client())
    for name in ("debug-reader", "stranger"):
        try:
            core.create_namespaced_service_account(NS, {"metadata": {"name": name}})
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    try:
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": "test-debug-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "linkpack-debug-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "debug-reader", "namespace": NS}],
            }
        )
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    with running_extender(cp, "extender-guarded") as extender:
        yield cp, extender


def _anonymous(extender: ExtenderProcess) -> httpx.Client:
    return httpx.Client(verify=ssl.create_default_context(cafile=str(extender.tls.server_ca)), timeout=10)


def test_a_bind_without_the_schedulers_certificate_gets_no_connection(
    guarded: tuple[ControlPlane, ExtenderProcess], cluster_namespace: str
) -> None:
    """Any pod that reaches the Service cannot bind a pending pod: without a client certificate,
    or with one of another CA, the TLS handshake fails and the pod stays unbound."""
    cp, extender = guarded
    core = client.CoreV1Api(cp.api_client())
    pod = core.create_namespaced_pod(
        cluster_namespace, api_pod_manifest("victim", gpus=1, node_selector={HOSTNAME: "no-such-node"})
    )
    body = {
        "PodName": "victim",
        "PodNamespace": cluster_namespace,
        "PodUID": pod.metadata.uid,
        "Node": "e2e-h100",
    }
    with _anonymous(extender) as anonymous, pytest.raises(httpx.TransportError):
        anonymous.post(f"{extender.url}/bind", json=body)
    rogue_context = ssl.create_default_context(cafile=str(extender.tls.server_ca))
    rogue_context.load_cert_chain(str(extender.tls.rogue_cert), str(extender.tls.rogue_key))
    with httpx.Client(verify=rogue_context, timeout=10) as rogue, pytest.raises(httpx.TransportError):
        rogue.post(f"{extender.url}/bind", json=body)
    assert core.read_namespaced_pod("victim", cluster_namespace).spec.node_name is None


def test_debug_reads_need_a_kubernetes_identity_with_the_rbac_permission(
    guarded: tuple[ControlPlane, ExtenderProcess],
) -> None:
    """The API server's TokenReview and SubjectAccessReview decide: no token 401, a service account
    without the ClusterRole 403, one bound to linkpack-debug-reader reads."""
    cp, extender = guarded
    url = f"{extender.debug_url}/debug/topology"
    reader = cp.service_account_token(NS, "debug-reader")
    stranger = cp.service_account_token(NS, "stranger")
    with _anonymous(extender) as http:
        assert http.get(url).status_code == 401
        assert http.get(url, headers={"Authorization": "Bearer not-a-token"}).status_code == 401
        refused = http.get(url, headers={"Authorization": f"Bearer {stranger}"})
        assert refused.status_code == 403
        assert (
            "system:serviceaccount:linkpack-system:stranger may not get debug/topology"
            in refused.json()["error"]
        )
        assert http.get(url, headers={"Authorization": f"Bearer {reader}"}).status_code == 200
        what_if = http.post(
            f"{extender.debug_url}/debug/what-if",
            headers={"Authorization": f"Bearer {reader}"},
            json=api_pod_manifest("maybe", gpus=1),
        )
        assert what_if.status_code in (200, 400)  # allowed through; the answer is about the pod
