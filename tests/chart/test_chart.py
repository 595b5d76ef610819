"""The Helm chart (charts/linkpack): it lints, its values reach the objects, manifests/ is its
rendering, and `helm install` creates the installation on a real kube-apiserver.

Helm is the pinned release built from its Go module (`tests.cluster.helm_binary`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.chart.render import (
    CHART,
    NAMESPACE,
    PUBLISH_SWITCHES,
    differences,
    helm_template,
    on_disk,
    render_all,
)
from tests.cluster.binaries import Binaries
from tests.cluster.controlplane import ControlPlane, wait_for_crd
from tests.cluster.helm_binary import ensure_helm


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_helm()


def _objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _run(helm: Path, *args: str) -> str:
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_committed_manifests_are_the_charts_fresh_rendering(helm: Path) -> None:
    """manifests/ is what `make manifests` writes now: nothing edited by hand, nothing stale."""
    assert differences(render_all(helm), on_disk()) == []


@pytest.mark.parametrize(
    "values",
    [
        (),
        tuple(s for s in PUBLISH_SWITCHES if not s.startswith("hostSchedulerConfig.")),
        ("nodeAgent.mps=true", "extender.replicas=1", "monitoring.podMonitors=true"),
    ],
    ids=["defaults", "optional-objects", "mps-single-replica"],
)
def test_the_chart_lints_clean(helm: Path, values: tuple[str, ...]) -> None:
    """`helm lint --strict` passes with the defaults, the optional objects on, and other values
    (the host scheduler's file is no API object and is left out: it is never installed)."""
    args = [a for v in values for a in ("--set", v)]
    assert "1 chart(s) linted, 0 chart(s) failed" in _run(helm, "lint", "--strict", str(CHART), *args)


def test_a_default_install_renders_the_ha_extender_and_nothing_optional(helm: Path) -> None:
    """Defaults: two extender replicas rolling with maxUnavailable 0, a PDB, preferred
    anti-affinity; no Namespace, cert-manager or Prometheus Operator objects."""
    objects = _objects(helm_template(helm))
    kinds = {o["kind"] for o in objects}
    assert kinds.isdisjoint({"Namespace", "Certificate", "Issuer", "PodMonitor", "PrometheusRule"})
    assert "KubeSchedulerConfiguration" not in kinds
    deployment = _one(objects, "Deployment", "linkpack-extender")["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    (term,) = deployment["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    pdb = _one(objects, "PodDisruptionBudget", "linkpack-extender")["spec"]
    assert pdb["minAvailable"] == 1
    assert pdb["selector"] == deployment["selector"]


def test_values_reach_every_object_that_uses_them(helm: Path) -> None:
    """Image, resource names, units, scheduler name, MPS, replicas, TLS Secrets and monitoring
    end up in the extender, the node agents and the scheduler's configuration alike."""
    values = {
        "image.repository": "registry.example/linkpack",
        "image.tag": "9.9.9",
        "image.pullPolicy": "Always",
        "resourceNames.gpu": "example.com/gpu",
        "resourceNames.shared": "example.com/gpu.shared",
        "resourceNames.memory": "example.com/gpu.memory",
        "resourceNames.migPrefix": "example.com/mig-",
        "unitsPerGpu": "1000",
        "schedulerName": "gpu-packer",
        "nodeAgent.mps": "true",
        "extender.replicas": "3",
        "extender.tlsSecret": "ext-tls",
        "scheduler.clientTlsSecret": "sched-tls",
        "monitoring.podMonitors": "true",
        "monitoring.alerts": "true",
    }
    args = [
        a for k, v in values.items() for a in ("--set-string" if k == "image.tag" else "--set", f"{k}={v}")
    ]
    objects = _objects(helm_template(helm, *args))
    extender = _one(objects, "Deployment", "linkpack-extender")["spec"]
    agent = _one(objects, "DaemonSet", "linkpack-node-agent")["spec"]["template"]["spec"]
    scheduler = _one(objects, "Deployment", "linkpack-scheduler")["spec"]["template"]["spec"]
    assert extender["replicas"] == 3
    (ext_container,) = extender["template"]["spec"]["containers"]
    (agent_container,) = agent["containers"]
    for container in (ext_container, agent_container):
        assert container["image"] == "registry.example/linkpack:9.9.9"
        assert container["imagePullPolicy"] == "Always"
        env = _env(container)
        assert env["LINKPACK_RESOURCE_GPU"] == "example.com/gpu"
        assert env["LINKPACK_RESOURCE_SHARED"] == "example.com/gpu.shared"
        assert env["LINKPACK_RESOURCE_MEMORY"] == "example.com/gpu.memory"
        assert env["LINKPACK_RESOURCE_MIG_PREFIX"] == "example.com/mig-"
        assert env["LINKPACK_UNITS_PER_GPU"] == "1000"
    assert _env(ext_container)["LINKPACK_SCHEDULER_NAME"] == "gpu-packer"
    volumes = {v["name"]: v for v in extender["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "ext-tls"
    assert {v["name"]: v for v in scheduler["volumes"]}["client-tls"]["secret"]["secretName"] == "sched-tls"
    assert "--mps" in agent_container["args"]
    assert _env(agent_container)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert {"mps", "mps-shm"} <= {v["name"] for v in agent["volumes"]}
    config_map = _one(objects, "ConfigMap", "linkpack-scheduler-config")
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    assert config["profiles"][0]["schedulerName"] == "gpu-packer"
    managed = {m["name"]: m["ignoredByScheduler"] for m in config["extenders"][0]["managedResources"]}
    assert managed["example.com/gpu"] is False
    assert managed["example.com/gpu.memory"] is True
    assert managed["example.com/mig-1g.10gb"] is False
    assert not [name for name in managed if name.startswith("nvidia.com/")]
    assert {o["kind"] for o in objects} >= {"PodMonitor", "PrometheusRule"}


def test_the_pod_security_labels_stay_with_the_namespace_object(helm: Path) -> None:
    """namespace.create=true renders the Namespace the node agent needs (privileged enforcement)."""
    objects = _objects(helm_template(helm, "--set", "namespace.create=true"))
    namespace = _one(objects, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


# ---------------------------------------------------------------------- helm install, for real


@pytest.fixture(scope="module")
def own_control_plane(k8s_binaries: Binaries) -> Iterator[ControlPlane]:
    """A control plane of its own: the session's has Linkpack objects created without Helm,
    which Helm would refuse to take over."""
    with ControlPlane(k8s_binaries) as cp:
        yield cp


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_helm_install_creates_the_installation_on_a_real_api_server(
    helm: Path, own_control_plane: ControlPlane
) -> None:
    """`helm install -n linkpack-system --create-namespace` creates the CRDs, RBAC, policies,
    the extender Deployment, Service and PDB, the scheduler and the node agent DaemonSet; an
    upgrade changes the extender's replicas; uninstall removes them (no kubelet: nothing runs)."""
    cp = own_control_plane
    kube = ("--kubeconfig", str(cp.kubeconfig_path))
    _run(helm, "install", "linkpack", str(CHART), "-n", NAMESPACE, "--create-namespace", *kube)
    api = cp.api_client()
    wait_for_crd(api, "gputopologies.linkpack.io")
    wait_for_crd(api, "gpuschedulingpolicies.linkpack.io")
    apps: Any = client.AppsV1Api(api)
    assert apps.read_namespaced_deployment("linkpack-extender", NAMESPACE).spec.replicas == 2
    assert apps.read_namespaced_deployment("linkpack-scheduler", NAMESPACE).spec.replicas == 1
    assert apps.read_namespaced_daemon_set("linkpack-node-agent", NAMESPACE).spec.selector.match_labels
    core: Any = client.CoreV1Api(api)
    assert core.read_namespaced_service("linkpack-extender", NAMESPACE).spec.ports
    assert core.read_namespaced_config_map("linkpack-scheduler-config", NAMESPACE).data
    policy: Any = client.PolicyV1Api(api)
    assert (
        policy.read_namespaced_pod_disruption_budget("linkpack-extender", NAMESPACE).spec.min_available == 1
    )
    admission: Any = client.AdmissionregistrationV1Api(api)
    names = {p.metadata.name for p in admission.list_validating_admission_policy().items}
    assert {"linkpack-node-agent-own-node", "linkpack-ledger-writers"} <= names
    rbac: Any = client.RbacAuthorizationV1Api(api)
    assert rbac.read_cluster_role("linkpack-extender").rules

    _run(helm, "upgrade", "linkpack", str(CHART), "-n", NAMESPACE, "--set", "extender.replicas=3", *kube)
    assert apps.read_namespaced_deployment("linkpack-extender", NAMESPACE).spec.replicas == 3
    assert "linkpack" in _run(helm, "list", "-n", NAMESPACE, "-q", *kube).split()

    _run(helm, "uninstall", "linkpack", "-n", NAMESPACE, *kube)
    assert NAMESPACE not in {
        d.metadata.namespace
        for d in apps.list_deployment_for_all_namespaces(
            label_selector="app.kubernetes.io/part-of=linkpack"
        ).items
    }
