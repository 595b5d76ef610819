"""The Helm chart (charts/linkpack): it lints, its values reach the objects, manifests/ is its
rendering, and `helm install` creates the installation on a real kube-apiserver.

Helm is the pinned release built from its Go module (`tests.cluster.helm_binary`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.chart.render import (
    CHART,
    KUBE_VERSION,
    MANIFESTS,
    NAMESPACE,
    PUBLISH_SWITCHES,
    differences,
    helm_template,
    on_disk,
    render_all,
)
from tests.cluster.binaries import Binaries
from tests.cluster.binaries import pinned_version as k8s_pinned_version
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
        (
            "imagePullSecrets={regcred}",
            "scheduler.image.tag=v1.35.2",
            "scheduler.extraArgs={--v=4}",
            "nodeAgent.tolerations=null",
            "metrics.scrapers=null",
        ),
    ],
    ids=["defaults", "optional-objects", "mps-single-replica", "placement-and-scrapers"],
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


# ------------------------------------------------ placement, pull secrets, arguments, scrapers

# The three workloads: their values key, kind and name.
WORKLOADS = {
    "nodeAgent": ("DaemonSet", "linkpack-node-agent"),
    "extender": ("Deployment", "linkpack-extender"),
    "scheduler": ("Deployment", "linkpack-scheduler"),
}
AGENT_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
]
AGENT_ARGS = [
    "--device-plugin-dir=/var/lib/kubelet/device-plugins",
    "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
    "--shim-host-dir=/var/lib/linkpack/shim",
    "--interposer-lib=/opt/linkpack/lib/liblinkpack_cuda.so",
    "--gpu-state-dir=/var/lib/linkpack/gpu-state",
]
SCHEDULER_COMMAND = ["kube-scheduler", "--config=/etc/linkpack/config/scheduler-config.yaml", "--v=2"]
EXTENDER_SPREAD = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "linkpack-extender"}},
                },
            }
        ]
    }
}
PROMETHEUS_ANYWHERE = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def _pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod template spec of each workload, by values key."""
    return {
        key: _one(objects, kind, name)["spec"]["template"]["spec"] for key, (kind, name) in WORKLOADS.items()
    }


def _with_values(helm: Path, tmp_path: Path, values: dict[str, Any], *extra: str) -> list[dict[str, Any]]:
    """`helm template` with `values` as a values file (lists and maps as a user writes them)."""
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    return _objects(helm_template(helm, "-f", str(values_file), *extra))


def _metrics_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ingress = _one(objects, "NetworkPolicy", "linkpack-extender")["spec"]["ingress"]
    return [rule for rule in ingress if rule["ports"] == [{"port": 8890, "protocol": "TCP"}]]


def test_the_defaults_render_todays_placement_arguments_and_scrapers(helm: Path) -> None:
    """Without values: the agent on GPU nodes with its three tolerations at node-critical
    priority, the extender spread over nodes, the scheduler of the given Kubernetes version, no
    pull secrets or extra arguments, and only Prometheus pods let in to the metrics port."""
    objects = _objects(helm_template(helm, "--kube-version", "v1.36.3"))
    specs = _pod_specs(objects)
    agent, extender, scheduler = specs["nodeAgent"], specs["extender"], specs["scheduler"]
    assert agent["priorityClassName"] == "system-node-critical"
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert agent["tolerations"] == AGENT_TOLERATIONS
    assert agent["containers"][0]["args"] == AGENT_ARGS
    assert extender["priorityClassName"] == "system-cluster-critical"
    assert extender["affinity"] == EXTENDER_SPREAD
    assert "args" not in extender["containers"][0]
    assert scheduler["priorityClassName"] == "system-cluster-critical"
    (container,) = scheduler["containers"]
    assert container["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    assert container["command"] == SCHEDULER_COMMAND
    assert "args" not in container
    absent = {
        "nodeAgent": {"affinity"},
        "extender": {"nodeSelector", "tolerations"},
        "scheduler": {"nodeSelector", "tolerations", "affinity"},
    }
    for key, spec in specs.items():
        assert (absent[key] | {"imagePullSecrets"}).isdisjoint(spec), key
    ingress = _one(objects, "NetworkPolicy", "linkpack-extender")["spec"]["ingress"]
    assert ingress == [
        {
            "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "linkpack-scheduler"}}}],
            "ports": [{"port": 8888, "protocol": "TCP"}],
        },
        {"from": [PROMETHEUS_ANYWHERE], "ports": [{"port": 8890, "protocol": "TCP"}]},
        {"ports": [{"port": 8889, "protocol": "TCP"}]},
    ]


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_placement_values_and_extra_arguments_reach_their_workload_only(
    helm: Path, tmp_path: Path, workload: str
) -> None:
    """tolerations, affinity, nodeSelector, priorityClassName and extraArgs of one workload land
    in its pod (replacing the default tolerations, appended after the default arguments) and
    nowhere else; imagePullSecrets reaches all three pods."""
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "gpu-infra", "effect": "NoSchedule"}]
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infra"]}]}
            ]
        }
    }
    values = {
        "imagePullSecrets": ["regcred", {"name": "mirror-cred"}],
        workload: {
            "tolerations": tolerations,
            "affinity": {"nodeAffinity": node_affinity},
            "nodeSelector": {"pool": "infra"},
            "priorityClassName": "linkpack-high",
            "extraArgs": ["--log-level=debug", "--flag=a b"],
        },
    }
    specs = _pod_specs(_with_values(helm, tmp_path, values))
    defaults = _pod_specs(_objects(helm_template(helm)))
    for key, spec in specs.items():
        assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}], key
        if key != workload:
            assert spec == {**defaults[key], "imagePullSecrets": spec["imagePullSecrets"]}, key
    spec = specs[workload]
    (container,) = spec["containers"]
    assert spec["tolerations"] == tolerations
    assert spec["priorityClassName"] == "linkpack-high"
    assert spec["affinity"]["nodeAffinity"] == node_affinity
    if workload == "extender":  # maps merge with the defaults: the spread stays
        assert spec["affinity"]["podAntiAffinity"] == EXTENDER_SPREAD["podAntiAffinity"]
    expected_selector = {"pool": "infra"}
    if workload == "nodeAgent":
        expected_selector["nvidia.com/gpu.present"] = "true"
    assert spec["nodeSelector"] == expected_selector
    if workload == "nodeAgent":
        assert container["args"] == [*AGENT_ARGS, "--log-level=debug", "--flag=a b"]
    else:
        assert container["args"] == ["--log-level=debug", "--flag=a b"]
    if workload == "scheduler":
        assert container["command"] == SCHEDULER_COMMAND


def test_default_placement_can_be_dropped(helm: Path, tmp_path: Path) -> None:
    """Empty tolerations and priority class, and a null default selector key and spread, leave
    those fields out of the pods."""
    values = {
        "nodeAgent": {
            "tolerations": [],
            "priorityClassName": "",
            "nodeSelector": {"nvidia.com/gpu.present": None},
        },
        "extender": {"affinity": {"podAntiAffinity": None}, "priorityClassName": ""},
    }
    specs = _pod_specs(_with_values(helm, tmp_path, values))
    assert {"tolerations", "priorityClassName", "nodeSelector"}.isdisjoint(specs["nodeAgent"])
    assert {"affinity", "priorityClassName"}.isdisjoint(specs["extender"])
    assert specs["scheduler"]["priorityClassName"] == "system-cluster-critical"


@pytest.mark.parametrize(
    ("kube_version", "tag"),
    [("1.35.2", "v1.35.2"), ("v1.34.1+k3s1", "v1.34.1"), ("v1.30.0", "v1.30.0"), ("1.36.3", "v1.36.3")],
)
def test_the_scheduler_image_follows_the_clusters_kubernetes_version(
    helm: Path, kube_version: str, tag: str
) -> None:
    """An empty scheduler.image.tag is the cluster's version (`--kube-version` for `helm template`)."""
    objects = _objects(helm_template(helm, "--kube-version", kube_version))
    (container,) = _pod_specs(objects)["scheduler"]["containers"]
    assert container["image"] == f"registry.k8s.io/kube-scheduler:{tag}"


@pytest.mark.parametrize(
    ("values", "image"),
    [
        (("scheduler.image.tag=v1.33.9",), "registry.k8s.io/kube-scheduler:v1.33.9"),
        (
            ("scheduler.image.repository=mirror.example/kube-scheduler",),
            "mirror.example/kube-scheduler:v1.35.2",
        ),
        (("scheduler.image=mirror.example/ks:v1.32.0",), "mirror.example/ks:v1.32.0"),
    ],
    ids=["tag", "repository", "whole-image-string"],
)
def test_a_scheduler_image_set_by_hand_wins(helm: Path, values: tuple[str, ...], image: str) -> None:
    args = [a for v in values for a in ("--set-string", v)]
    objects = _objects(helm_template(helm, "--kube-version", "1.35.2", *args))
    (container,) = _pod_specs(objects)["scheduler"]["containers"]
    assert container["image"] == image


@pytest.mark.parametrize(
    ("version", "major", "minor", "tag"),
    [
        ("v1.33.2-eks-4f2a1c7", "1", "33+", "v1.33.2"),
        ("v1.34.1+k3s1", "1", "34", "v1.34.1"),
        ("v1.31.4-gke.1200000", "1", "31+", "v1.31.4"),
        ("1.32.0", "1", "32", "v1.32.0"),
        ("v1.30", "1", "30+", "v1.30.0"),  # no plain version: major and minor, patch 0
    ],
)
def test_the_version_tag_cuts_provider_suffixes(
    helm: Path, tmp_path: Path, version: str, major: str, minor: str, tag: str
) -> None:
    """A cluster's version as Helm reads it from the API server (GitVersion, and a minor with
    "+" on some providers; `--kube-version` cannot give these): the chart's helper, run in a
    chart of its own, makes a kube-scheduler tag of it."""
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.0.1\n")
    (chart / "templates" / "_helpers.tpl").write_text((CHART / "templates" / "_helpers.tpl").read_text())
    (chart / "templates" / "probe.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\ndata:\n"
        '  tag: {{ include "linkpack.kubeVersionTag" (dict "Version" .Values.version'
        ' "Major" .Values.major "Minor" .Values.minor) | quote }}\n'
    )
    args = [
        a
        for k, v in {"version": version, "major": major, "minor": minor}.items()
        for a in ("--set-string", f"{k}={v}")
    ]
    (config_map,) = _objects(_run(helm, "template", "probe", str(chart), *args))
    assert config_map["data"]["tag"] == tag


def test_manifests_carry_the_scheduler_of_the_version_the_cluster_tests_build() -> None:
    """manifests/ is rendered for the Kubernetes release of tests/cluster/k8s/go.mod."""
    assert k8s_pinned_version() == KUBE_VERSION
    rendered = _objects((MANIFESTS / "scheduler-deployment.yaml").read_text())
    (container,) = _one(rendered, "Deployment", "linkpack-scheduler")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["image"] == f"registry.k8s.io/kube-scheduler:{KUBE_VERSION}"


def test_the_metrics_port_admits_the_configured_scrapers(helm: Path, tmp_path: Path) -> None:
    """metrics.scrapers are the `from` peers of the metrics port's rule, as written."""
    scrapers = [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app": "vmagent"}},
        },
        {"ipBlock": {"cidr": "10.20.0.0/16"}},
    ]
    (rule,) = _metrics_rules(_with_values(helm, tmp_path, {"metrics": {"scrapers": scrapers}}))
    assert rule["from"] == scrapers


def test_no_scrapers_admit_no_one_to_the_metrics_port(helm: Path, tmp_path: Path) -> None:
    """An empty list leaves the metrics rule out (an empty `from` would admit every source);
    the verbs and debug rules stay."""
    objects = _with_values(helm, tmp_path, {"metrics": {"scrapers": []}})
    assert _metrics_rules(objects) == []
    ingress = _one(objects, "NetworkPolicy", "linkpack-extender")["spec"]["ingress"]
    assert [rule["ports"][0]["port"] for rule in ingress] == [8888, 8889]
    assert all(rule.get("from") for rule in ingress if rule["ports"][0]["port"] == 8888)


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
    scheduler = apps.read_namespaced_deployment("linkpack-scheduler", NAMESPACE).spec
    assert scheduler.replicas == 1
    # the API server's own version (GitVersion, as Helm reads it), not a pinned one
    api_version = client.VersionApi(api).get_code().git_version
    assert scheduler.template.spec.containers[0].image == (
        f"registry.k8s.io/kube-scheduler:{re.split('[-+]', api_version)[0]}"
    )
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
    # the API server serves MutatingAdmissionPolicy (1.36+), so the routing policy is installed
    assert _mutating_policies(admission) == {"linkpack-route-gpu-pods"}
    rbac: Any = client.RbacAuthorizationV1Api(api)
    assert rbac.read_cluster_role("linkpack-extender").rules

    _run(helm, "upgrade", "linkpack", str(CHART), "-n", NAMESPACE, "--set", "extender.replicas=3", *kube)
    assert apps.read_namespaced_deployment("linkpack-extender", NAMESPACE).spec.replicas == 3
    assert "linkpack" in _run(helm, "list", "-n", NAMESPACE, "-q", *kube).split()

    _run(helm, "uninstall", "linkpack", "-n", NAMESPACE, *kube)
    assert _mutating_policies(admission) == set()
    assert NAMESPACE not in {
        d.metadata.namespace
        for d in apps.list_deployment_for_all_namespaces(
            label_selector="app.kubernetes.io/part-of=linkpack"
        ).items
    }


def _mutating_policies(admission: Any) -> set[str]:
    return {p.metadata.name for p in admission.list_mutating_admission_policy().items}
