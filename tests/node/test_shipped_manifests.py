"""The shipped manifests on a real node: the node agent DaemonSet and the extender Deployment
of `manifests/` run as pods from the project image under the real kubelet, with the shipped
RBAC, admission policies, security contexts, commands and volumes; kube-scheduler (a host
process with the shipped configuration) sends a whole-GPU pod and a share pod through the
extender pod, and their containers see exactly the GPUs the extender recorded.

The test overlay (`_on_test_node` and `agent_pod`, applied to the parsed objects), and why each line is needed:
- no controller-manager runs, so no DaemonSet or ReplicaSet controller makes the pods and no
  default scheduler places them: each pod is made from its shipped template, bound to the node
  (the DaemonSet and the Deployment themselves are only validated by the API server, dry run);
- the ServiceAccount admission plugin and the root-CA publisher are off in the test control
  plane: the test creates the `kube-root-ca.crt` ConfigMap and adds the service-account token
  volume to each pod exactly as that plugin would;
- no CNI: `hostNetwork: true`, the not-ready toleration, and KUBERNETES_SERVICE_HOST/PORT
  naming the loopback API server;
- no GPU: the agent gets `--simulate dgx-a100` and no `runtimeClassName: nvidia`, and the node
  gets the `nvidia.com/gpu.present` label GPU Feature Discovery would set; simulate mode reads
  the captured `topo -m` files, which the image does not carry: they are mounted read-only
  from the checkout's shared data, named by LINKPACK_SHARED;
- the test kubelet's root directory is not /var/lib/kubelet: the pod-resources hostPath names
  the test kubelet's own pod-resources directory (the container still sees the shipped path);
- one extender pod, not the Deployment's two replicas: two hostNetwork replicas on one node
  would collide on their ports;
- the extender's Secret `linkpack-extender-tls` holds the test certificates (tests/tls_certs.py).
"""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from image_build import build
from tests.cluster.controlplane import MANIFESTS, ControlPlane, load_manifest, temporary_namespace, wait_for
from tests.cluster.linkpack_env import extender_tls, scheduler_config
from tests.image.conftest import ensure_build_prerequisites
from tests.node.checks import visible_gpus
from tests.node.linkpack_stack import MACHINE, env_of, recorded, wait_pod_phase
from tests.node.real_node import NOT_READY_TOLERATION, POD_LOGS, RealNode, host_pod, stop_signal_safe
from tests.support.resources import GPU, SHARED
from topology.catalog import SHARED_ENV, topo_dir

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.image, pytest.mark.timeout(600)]

SYSTEM = "linkpack-system"
GPU_PRESENT = "nvidia.com/gpu.present"
HOST_STATE = Path("/var/lib/linkpack")  # the agent's shim and GPU-state hostPaths live here
VERBS_PORT, OPS_PORT = 8888, 8890  # the extender container's shipped ports (hostNetwork: on loopback)
TOKEN_VOLUME = "kube-api-access"
SIMULATED_SHARED = "/opt/linkpack/shared"
SIMULATED_TOPOLOGIES = f"{SIMULATED_SHARED}/data/topo"
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def _shipped(name: str, kind: str) -> dict[str, Any]:
    (obj,) = [o for o in load_manifest(MANIFESTS / name) if o["kind"] == kind]
    return obj


def _token_volume() -> dict[str, Any]:
    """The projected volume the ServiceAccount admission plugin adds to every pod."""
    return {
        "name": TOKEN_VOLUME,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }


def _on_test_node(workload: dict[str, Any], cp: ControlPlane, node: RealNode) -> dict[str, Any]:
    """The pod the workload's controller would make, bound to the node, with the overlay."""
    template = copy.deepcopy(workload["spec"]["template"])
    spec = template["spec"]
    spec["nodeName"] = node.node
    spec["hostNetwork"] = True
    spec["tolerations"] = [*spec.get("tolerations", []), NOT_READY_TOLERATION]
    spec["volumes"] = [*spec.get("volumes", []), _token_volume()]
    for container in spec["containers"]:
        container["env"] = [
            *container.get("env", []),
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(cp.apiserver_port)},
        ]
        mount = {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT, "readOnly": True}
        container["volumeMounts"] = [*container.get("volumeMounts", []), mount]
    metadata = {
        "name": f"{workload['metadata']['name']}-{node.node}",
        "namespace": workload["metadata"]["namespace"],
        "labels": template["metadata"]["labels"],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def agent_pod(cp: ControlPlane, node: RealNode) -> dict[str, Any]:
    pod = _on_test_node(_shipped("node-agent-daemonset.yaml", "DaemonSet"), cp, node)
    spec = pod["spec"]
    spec.pop("runtimeClassName")
    (container,) = spec["containers"]
    container["args"] = [*container["args"], f"--simulate={MACHINE}"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "pod-resources"]
    volume["hostPath"]["path"] = str(node.pod_resources_socket.parent)
    # simulate mode reads its machine from the captured `topo -m` files, which the image does
    # not carry: they are mounted read-only where LINKPACK_SHARED says
    spec["volumes"].append({"name": "topologies", "hostPath": {"path": str(topo_dir()), "type": "Directory"}})
    container["volumeMounts"].append(
        {"name": "topologies", "mountPath": SIMULATED_TOPOLOGIES, "readOnly": True}
    )
    container["env"].append({"name": SHARED_ENV, "value": SIMULATED_SHARED})
    return pod


def extender_pod(cp: ControlPlane, node: RealNode) -> dict[str, Any]:
    return _on_test_node(_shipped("extender-deployment.yaml", "Deployment"), cp, node)


def _apiserver_ca(cp: ControlPlane) -> str:
    """The CA of the API server's self-signed serving certificate (the chain's last block)."""
    text = (cp.workdir / "certs" / "apiserver.crt").read_text()
    blocks = [b + "-----END CERTIFICATE-----\n" for b in text.split("-----END CERTIFICATE-----") if b.strip()]
    return blocks[-1].lstrip()


@contextlib.contextmanager
def _created(cp: ControlPlane, objects: list[dict[str, Any]]) -> Iterator[None]:
    """Create `objects`; delete them afterwards (pods: waited for, the kubelet confirms)."""
    dynamic = cp.dynamic_client()
    made: list[dict[str, Any]] = []
    try:
        for obj in objects:
            cp.create_objects([obj])
            made.append(obj)
        yield
    finally:
        for obj in reversed(made):
            resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace")
            with contextlib.suppress(ApiException):
                resource.delete(name=name, namespace=namespace)
        pods = dynamic.resources.get(api_version="v1", kind="Pod")
        for obj in made:
            if obj["kind"] != "Pod":
                continue

            def gone(o: dict[str, Any] = obj) -> bool:
                try:
                    pods.get(name=o["metadata"]["name"], namespace=o["metadata"]["namespace"])
                except ApiException as exc:
                    return exc.status == 404
                return False

            wait_for(gone, 60, f"pod {obj['metadata']['name']} to be deleted")


@contextlib.contextmanager
def _labelled(core: Any, node: str, key: str, value: str) -> Iterator[None]:
    core.patch_node(node, {"metadata": {"labels": {key: value}}})
    try:
        yield
    finally:
        core.patch_node(node, {"metadata": {"labels": {key: None}}})


@contextlib.contextmanager
def _host_state_removed_after() -> Iterator[None]:
    existed = HOST_STATE.exists()
    try:
        yield
    finally:
        if not existed:
            shutil.rmtree(HOST_STATE, ignore_errors=True)


@pytest.fixture(scope="module")
def project_image(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> None:
    ensure_build_prerequisites()
    real_node.import_image(build(tmp_path_factory.mktemp("image")))


def _ready(core: Any, name: str) -> bool:
    pod = core.read_namespaced_pod(name, SYSTEM)
    if pod.status.phase in {"Failed", "Succeeded"}:
        raise AssertionError(f"{name} ended: {pod.status}")
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _pod_log(node: RealNode, core: Any, name: str, container: str) -> str:
    """What the container printed, over its restarts (`<restarts>.log`), and its statuses."""
    pod = core.read_namespaced_pod(name, SYSTEM)
    directory = POD_LOGS / f"{SYSTEM}_{name}_{pod.metadata.uid}" / container
    printed = "\n".join(p.read_text(errors="replace") for p in sorted(directory.glob("*.log")))
    return f"{pod.status.container_statuses}\n{printed[-4000:]}"


def test_shipped_agent_and_extender_pods_schedule_gpu_pods(real_node: RealNode, project_image: None) -> None:
    """With the shipped DaemonSet and Deployment running as pods from the image (test overlay in
    the module docstring), the agent pod publishes the node's GpuTopology and registers its
    device plugin (8 GPUs), the extender pod is Ready, and a 2-GPU pod and a 25-unit share pod
    scheduled by kube-scheduler through it run and print exactly their recorded GPUs."""
    cp, node = real_node.cp, real_node
    api = cp.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    tls = extender_tls(cp)
    agent, extender = agent_pod(cp, node), extender_pod(cp, node)
    workloads = [
        _shipped("node-agent-daemonset.yaml", "DaemonSet"),
        *[o for o in load_manifest(MANIFESTS / "extender-deployment.yaml") if o["kind"] == "Deployment"],
    ]
    cp.create_objects(workloads, dry_run=True)  # the shipped objects as the API server takes them
    prerequisites = [
        *load_manifest(MANIFESTS / "node-agent-policy.yaml"),
        *load_manifest(MANIFESTS / "ledger-policy.yaml"),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": SYSTEM},
            "data": {"ca.crt": _apiserver_ca(cp)},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "linkpack-extender-tls", "namespace": SYSTEM},
            "type": "kubernetes.io/tls",
            "stringData": {
                "tls.crt": tls.server_cert.read_text(),
                "tls.key": tls.server_key.read_text(),
                "ca.crt": tls.client_ca.read_text(),
            },
        },
    ]
    with contextlib.suppress(ApiException):  # an earlier host-process agent's; ours must publish it
        custom.delete_cluster_custom_object("linkpack.io", "v1alpha1", "gputopologies", node.node)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_host_state_removed_after())
        stack.enter_context(_labelled(core, node.node, GPU_PRESENT, "true"))
        stack.enter_context(_created(cp, prerequisites))
        stack.enter_context(_created(cp, [agent, extender]))
        agent_name, extender_name = agent["metadata"]["name"], extender["metadata"]["name"]

        wait_for(
            lambda: _ready(core, agent_name),
            120,
            "the node agent pod Ready",
            on_timeout=lambda: _pod_log(node, core, agent_name, "node-agent") + node.kubelet_log(),
        )
        topology = wait_for(
            lambda: _topology(custom, node.node),
            60,
            "the agent pod's GpuTopology",
            on_timeout=lambda: _pod_log(node, core, agent_name, "node-agent"),
        )
        assert len(topology["spec"]["gpus"]) == 8, topology["spec"]
        wait_for(
            lambda: str((core.read_node(node.node).status.capacity or {}).get(GPU)) == "8",
            60,
            "the kubelet to advertise the agent pod's 8 GPUs",
            on_timeout=lambda: _pod_log(node, core, agent_name, "node-agent") + node.kubelet_log(),
        )
        wait_for(
            lambda: _ready(core, extender_name),
            120,
            "the extender pod Ready",
            on_timeout=lambda: _pod_log(node, core, extender_name, "extender") + node.kubelet_log(),
        )
        assert httpx.get(f"http://127.0.0.1:{OPS_PORT}/readyz", timeout=5).status_code == 200

        cp.start_scheduler(scheduler_config(cp, f"https://127.0.0.1:{VERBS_PORT}", tls))
        stack.callback(cp.stop_scheduler)
        namespace = stack.enter_context(temporary_namespace(api, prefix="shipped-"))
        pods = {"two": {GPU: "2"}, "share": {SHARED: "25"}}
        for name, limits in pods.items():
            core.create_namespaced_pod(
                namespace, host_pod(name, stop_signal_safe("env; sleep 300 & wait"), limits=limits)
            )
        stack.callback(_delete_pods, core, namespace, list(pods))
        for name in pods:
            pod = wait_pod_phase(core, namespace, name, {"Running", "Failed"}, 90)
            assert pod.status.phase == "Running", (
                pod.status,
                _pod_log(node, core, extender_name, "extender"),
            )
            record = recorded(pod)
            assert record is not None and record.node == node.node, pod.metadata.annotations
            want = frozenset(g.uuid for g in record.grants)
            assert len(want) == (2 if name == "two" else 1), record

            def printed(p: Any = pod) -> dict[str, str]:
                env = env_of(node.container_log(namespace, p.metadata.name, p.metadata.uid, "main"))
                return env if "PATH" in env else {}

            env = wait_for(printed, 30, f"{name}'s environment in its log")
            assert visible_gpus(env) == want, (name, env)


def _topology(custom: Any, node: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = custom.get_cluster_custom_object(
            "linkpack.io", "v1alpha1", "gputopologies", node
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _delete_pods(core: Any, namespace: str, names: list[str]) -> None:
    """Delete the test pods and wait until the kubelet has stopped them (their GPUs free again)."""
    for name in names:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=2)

    def gone() -> bool:
        return not core.list_namespaced_pod(namespace).items

    wait_for(gone, 60, f"the pods of {namespace} to be deleted")
