"""Node labels: what each catalog machine is labelled, the ownership rules, applying them, the agent."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.keys import MANAGED_LABELS_ANNOTATION, MPS_LABEL, NUMA_NODES_LABEL, NVLINK_CLIQUE_LABEL
from node_agent.config import AgentConfig
from node_agent.kube.client import MERGE_PATCH, KubernetesNodeApi
from node_agent.kube.node_api import KubeConflict, KubeError
from node_agent.loop.agent_loop import Agent
from node_agent.loop.node_labels import (
    CUDA_DRIVER_MAJOR_LABEL,
    CUDA_DRIVER_MINOR_LABEL,
    CUDA_DRIVER_REV_LABEL,
    CUDA_RUNTIME_MAJOR_LABEL,
    CUDA_RUNTIME_MINOR_LABEL,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    LABEL_KEYS,
    MIG_CAPABLE_LABEL,
    NVLINK_LABEL,
    NVSWITCH_LABEL,
    SXM_LABEL,
    LabelConflict,
    LabelFacts,
    NodeLabeler,
    decode_managed_labels,
    encode_managed_labels,
    is_sxm,
    label_value,
    node_labels,
    nvlink_clique,
    plan_labels,
)
from node_agent.metrics import AgentMetrics
from node_agent.sources.nvml_simulated import SimulatedNvml
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.support.machines import catalog_machine, topo_text
from topology.model import Gpu, GpuLink, LinkKind, MigMode, NodeTopology

FACTS = LabelFacts(driver_version="550.54.15", cuda_driver_version="12.4")
DRIVER_LABELS = {
    CUDA_DRIVER_MAJOR_LABEL: "550",
    CUDA_DRIVER_MINOR_LABEL: "54",
    CUDA_DRIVER_REV_LABEL: "15",
    CUDA_RUNTIME_MAJOR_LABEL: "12",
    CUDA_RUNTIME_MINOR_LABEL: "4",
}


def _topology(models: list[str], nv: dict[tuple[int, int], int] | None = None, **gpu: Any) -> NodeTopology:
    """GPUs of these models, NVLinked as `nv` says ((a, b) -> links), SYS otherwise."""
    nv = nv or {}
    gpus = tuple(Gpu(i, uuid=f"GPU-{i}", model=m, memory_mib=1024, **gpu) for i, m in enumerate(models))
    links = tuple(
        GpuLink(a, b, LinkKind.NV, nv[(a, b)]) if (a, b) in nv else GpuLink(a, b, LinkKind.SYS)
        for a in range(len(models))
        for b in range(a + 1, len(models))
    )
    return NodeTopology(gpus=gpus, gpu_links=links)


# ---------------------------------------------------------------------- what each machine says


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "dgx-a100",
            {
                GPU_PRODUCT_LABEL: "A100-SXM4-40GB",
                GPU_COUNT_LABEL: "8",
                GPU_MEMORY_LABEL: "40960",
                SXM_LABEL: "true",
                NVLINK_LABEL: "true",
                NVSWITCH_LABEL: "true",
                NVLINK_CLIQUE_LABEL: "8",
                NUMA_NODES_LABEL: "4",  # the GPU pairs sit on NUMA nodes 3, 1, 7 and 5
            },
        ),
        (
            "hgx-h100",  # "H100 80GB HBM3" does not say SXM: NVSwitch does
            {
                GPU_PRODUCT_LABEL: "H100-80GB-HBM3",
                GPU_COUNT_LABEL: "8",
                GPU_MEMORY_LABEL: "81559",
                SXM_LABEL: "true",
                NVLINK_LABEL: "true",
                NVSWITCH_LABEL: "true",
                NVLINK_CLIQUE_LABEL: "8",
                NUMA_NODES_LABEL: "2",
            },
        ),
        (
            "dgx1-v100",  # hybrid cube mesh: the largest all-NVLinked set is 4; the capture shows no NUMA
            {
                GPU_PRODUCT_LABEL: "V100-SXM2-32GB",
                GPU_COUNT_LABEL: "8",
                GPU_MEMORY_LABEL: "32768",
                SXM_LABEL: "true",
                NVLINK_LABEL: "true",
                NVSWITCH_LABEL: "false",
                NVLINK_CLIQUE_LABEL: "4",
            },
        ),
        (
            "rtx3090-2socket",
            {
                GPU_PRODUCT_LABEL: "RTX-3090",
                GPU_COUNT_LABEL: "8",
                GPU_MEMORY_LABEL: "24576",
                SXM_LABEL: "false",
                NVLINK_LABEL: "false",
                NVSWITCH_LABEL: "false",
                NVLINK_CLIQUE_LABEL: "1",
                NUMA_NODES_LABEL: "2",
            },
        ),
        (
            "pcie-nv12-pairs",  # PCIe cards with NVLink bridges in pairs; the model is unknown
            {
                SXM_LABEL: "false",
                NVLINK_LABEL: "true",
                NVSWITCH_LABEL: "false",
                NVLINK_CLIQUE_LABEL: "2",
                NUMA_NODES_LABEL: "2",
            },
        ),
    ],
)
def test_labels_of_each_catalog_machine(name, expected):
    """Each captured machine gets the GFD labels it can, the SXM/NVLink/NVSwitch verdicts and its clique."""
    labels = node_labels(catalog_machine(name), FACTS)
    assert labels == {**expected, **DRIVER_LABELS, MIG_CAPABLE_LABEL: "false", MPS_LABEL: "false"}
    assert set(labels) <= LABEL_KEYS


@pytest.mark.timeout(10)
def test_labels_follow_the_facts():
    """MIG support, MPS and an unknown driver show in the labels; a node without GPUs gets none."""
    a100 = catalog_machine("dgx-a100")
    mig_ready = replace(a100, gpus=tuple(replace(g, mig_mode=MigMode.DISABLED) for g in a100.gpus))
    assert node_labels(mig_ready, FACTS)[MIG_CAPABLE_LABEL] == "true"
    assert node_labels(a100, replace(FACTS, mps_active=True))[MPS_LABEL] == "true"
    unknown = node_labels(a100, LabelFacts())
    assert not set(DRIVER_LABELS) & set(unknown) and unknown[GPU_COUNT_LABEL] == "8"
    assert node_labels(NodeTopology(gpus=()), FACTS) == {}


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("driver", "cuda", "expected"),
    [
        ("535.104.05", "12.2", ("535", "104", "05", "12", "2")),  # GFD keeps the revision as written
        ("550.54", "12.4", ("550", "54", "", "12", "4")),  # two parts: an empty revision, as GFD
        ("550", "12.4", (None, None, None, "12", "4")),
        ("550.54.15.1", "", (None, None, None, None, None)),
        ("r550 beta", "12", (None, None, None, None, None)),
    ],
)
def test_driver_and_cuda_version_labels(driver, cuda, expected):
    """The driver version splits into major, minor and revision, the CUDA version into major and minor."""
    labels = node_labels(catalog_machine("hgx-h100"), LabelFacts(driver, cuda))
    keys = (
        CUDA_DRIVER_MAJOR_LABEL,
        CUDA_DRIVER_MINOR_LABEL,
        CUDA_DRIVER_REV_LABEL,
        CUDA_RUNTIME_MAJOR_LABEL,
        CUDA_RUNTIME_MINOR_LABEL,
    )
    assert tuple(labels.get(k) for k in keys) == expected


@pytest.mark.timeout(10)
def test_product_label_values():
    """Spaces become dashes as in GFD; other characters a label value cannot hold too, cut to 63."""
    assert label_value("NVIDIA A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"
    assert label_value("NVIDIA GeForce RTX 3090") == "NVIDIA-GeForce-RTX-3090"
    assert label_value("  Odd (GPU) / v2 ") == "Odd--GPU----v2"
    assert len(label_value("X" * 80)) == 63 and label_value("(") == ""
    mixed = node_labels(_topology(["NVIDIA A10", "NVIDIA T4", "NVIDIA T4"]), FACTS)
    assert (mixed[GPU_PRODUCT_LABEL], mixed[GPU_COUNT_LABEL]) == ("NVIDIA-T4", "2")  # the most common


@pytest.mark.timeout(10)
def test_sxm_verdict():
    """SXM by name, by NVSwitch or by an NVLink mesh; never for PCIe names or bridged pairs alone."""
    assert is_sxm(_topology(["NVIDIA A100-SXM4-80GB"]))  # by name, even alone
    assert not is_sxm(_topology(["NVIDIA H100 PCIe", "NVIDIA H100 PCIe"], {(0, 1): 12}))
    assert not is_sxm(_topology(["NVIDIA H100 NVL"] * 4, {(0, 1): 12, (2, 3): 12}))  # bridged pairs
    assert is_sxm(_topology(["Some GPU"] * 3, {(0, 1): 2, (0, 2): 2}))  # GPU 0 NVLinked to two peers
    assert not is_sxm(_topology(["NVIDIA H100 PCIe"] * 3, {(0, 1): 2, (0, 2): 2}))  # the name wins
    assert not is_sxm(_topology(["NVIDIA GeForce RTX 4090"] * 2))


@pytest.mark.timeout(10)
def test_nvlink_clique_is_the_largest_all_pairs_nvlinked_set():
    """The clique is the largest set of GPUs all pairwise NVLinked, however the links are drawn."""
    ring = {(0, 1): 1, (1, 2): 1, (2, 3): 1, (0, 3): 1}
    assert nvlink_clique(_topology(["g"] * 4, ring)) == 2
    triangle_and_pair = {(0, 1): 1, (0, 2): 1, (1, 2): 1, (3, 4): 4}
    assert nvlink_clique(_topology(["g"] * 5, triangle_and_pair)) == 3
    assert nvlink_clique(_topology(["g"] * 3)) == 1 and nvlink_clique(NodeTopology(gpus=())) == 0
    assert nvlink_clique(catalog_machine("dgx2")) == 16


# ---------------------------------------------------------------------- the rules


WANT = {GPU_PRODUCT_LABEL: "A100-SXM4-40GB", SXM_LABEL: "true", NVLINK_CLIQUE_LABEL: "8"}


@pytest.mark.timeout(10)
def test_a_bare_node_gets_every_label_and_the_record():
    """On a node without our labels every label is added and recorded with its value."""
    plan = plan_labels(WANT, {"kubernetes.io/hostname": "n1"}, None)
    assert dict(plan.labels) == WANT and dict(plan.managed) == WANT
    assert plan.writes and plan.conflicts == () and plan.problems == ()
    assert json.loads(plan.annotation or "") == WANT


@pytest.mark.timeout(10)
def test_nothing_is_written_when_the_node_already_says_it():
    """Labels and record as wanted: no write."""
    plan = plan_labels(WANT, {**WANT, "other": "x"}, encode_managed_labels(WANT))
    assert not plan.writes and dict(plan.labels) == {}


@pytest.mark.timeout(10)
def test_own_labels_change_and_go_with_the_hardware():
    """A changed fact changes the agent's label; its label that no longer applies is removed."""
    before = {**WANT, NUMA_NODES_LABEL: "2"}
    after = {**WANT, NVLINK_CLIQUE_LABEL: "4"}
    plan = plan_labels(after, before, encode_managed_labels(before))
    assert dict(plan.labels) == {NVLINK_CLIQUE_LABEL: "4", NUMA_NODES_LABEL: None}
    assert dict(plan.managed) == after and plan.conflicts == ()


@pytest.mark.timeout(10)
def test_a_label_the_agent_did_not_set_is_never_removed():
    """A label of a wanted key set by someone else to the same value stays theirs, also when it no longer applies."""
    current = {**WANT, NUMA_NODES_LABEL: "2"}  # NUMA set by someone else, the rest by the agent
    plan = plan_labels(WANT, current, encode_managed_labels(WANT))
    assert not plan.writes
    same = plan_labels({**WANT, NUMA_NODES_LABEL: "2"}, current, encode_managed_labels(WANT))
    assert not same.writes and NUMA_NODES_LABEL not in same.managed  # same value: not claimed
    foreign = plan_labels({}, {"nvidia.com/gpu.present": "true", **WANT}, None)
    assert dict(foreign.labels) == {} and not foreign.writes


@pytest.mark.timeout(10)
def test_a_conflicting_label_is_left_alone_and_reported():
    """A wanted label holding another value the agent did not set is left, reported, and not recorded."""
    current = {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}  # GPU Feature Discovery's spelling
    plan = plan_labels(WANT, current, None)
    assert GPU_PRODUCT_LABEL not in plan.labels and GPU_PRODUCT_LABEL not in plan.managed
    assert plan.conflicts == (LabelConflict(GPU_PRODUCT_LABEL, "NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),)
    assert plan.reports == (
        "node label nvidia.com/gpu.product='NVIDIA-A100-SXM4-40GB' was not set by the node agent, "
        "which would set 'A100-SXM4-40GB'; left alone",
    )
    assert dict(plan.labels) == {SXM_LABEL: "true", NVLINK_CLIQUE_LABEL: "8"}  # the rest goes on


@pytest.mark.timeout(10)
def test_an_own_label_someone_changed_becomes_theirs():
    """When someone changes a label the agent set, it is theirs: left, reported, dropped from the record."""
    current = {**WANT, SXM_LABEL: "false"}
    plan = plan_labels(WANT, current, encode_managed_labels(WANT))
    assert dict(plan.labels) == {} and SXM_LABEL not in plan.managed and plan.managed_changed
    assert [c.key for c in plan.conflicts] == [SXM_LABEL]
    gone = plan_labels(
        {k: v for k, v in WANT.items() if k != SXM_LABEL}, current, encode_managed_labels(WANT)
    )
    assert SXM_LABEL not in gone.labels  # no longer wanted, but no longer the agent's to remove


@pytest.mark.timeout(10)
def test_an_own_label_someone_removed_is_set_again():
    """An agent's label removed by hand comes back (the agent keeps the node as it says)."""
    current = {k: v for k, v in WANT.items() if k != SXM_LABEL}
    plan = plan_labels(WANT, current, encode_managed_labels(WANT))
    assert dict(plan.labels) == {SXM_LABEL: "true"} and dict(plan.managed) == WANT


@pytest.mark.timeout(10)
def test_the_record_is_read_with_care():
    """A malformed record is a problem (every label is then someone else's); keys outside ours are ignored."""
    plan = plan_labels(WANT, dict(WANT), "not json")
    assert not plan.labels and dict(plan.managed) == {} and plan.managed_changed
    assert MANAGED_LABELS_ANNOTATION in plan.problems[0] and plan.annotation is None
    record, problem = decode_managed_labels(json.dumps({"kubernetes.io/hostname": "n1", SXM_LABEL: "true"}))
    assert record == {SXM_LABEL: "true"} and problem == ""
    assert decode_managed_labels(json.dumps({SXM_LABEL: 1}))[1] and decode_managed_labels("")[0] == {}
    plan = plan_labels({}, {"kubernetes.io/hostname": "n1"}, json.dumps({"kubernetes.io/hostname": "n1"}))
    assert dict(plan.labels) == {} and plan.annotation is None  # a foreign key in the record: not removed


# ---------------------------------------------------------------------- applying


@pytest.mark.timeout(10)
def test_the_labeler_writes_one_patch_at_the_version_read():
    """Labels and the record go in one patch with the resourceVersion read; a 409 is retried next time."""
    api = FakeNodeApi()
    labeler = NodeLabeler(api, "n1")
    outcome = labeler.reconcile(WANT)
    assert outcome.wrote and api.node_labels == WANT
    assert json.loads(api.node_annotations[MANAGED_LABELS_ANNOTATION]) == WANT
    (labels, annotations, version) = api.label_patches[0]
    assert labels == WANT and set(annotations) == {MANAGED_LABELS_ANNOTATION} and version == "1"
    assert not labeler.reconcile(WANT).wrote and len(api.label_patches) == 1

    real_patch = api.patch_node_labels

    def racing(node: str, labels: Any, annotations: Any, resource_version: str) -> None:
        api.label_node({GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"})  # GFD writes in between
        api.patch_node_labels = real_patch  # type: ignore[method-assign]
        real_patch(node, labels, annotations, resource_version)

    api.patch_node_labels = racing  # type: ignore[method-assign]
    changed = labeler.reconcile({**WANT, NVLINK_CLIQUE_LABEL: "4"})
    assert not changed.wrote and "changed while it was being labelled" in changed.error
    again = labeler.reconcile({**WANT, NVLINK_CLIQUE_LABEL: "4"})
    assert again.wrote and api.node_labels[NVLINK_CLIQUE_LABEL] == "4"
    assert api.node_labels[GPU_PRODUCT_LABEL] == "NVIDIA-A100-SXM4-40GB"  # GFD's value kept
    assert again.plan is not None and [c.key for c in again.plan.conflicts] == [GPU_PRODUCT_LABEL]


@pytest.mark.timeout(10)
def test_the_labeler_reports_api_failures_and_writes_nothing():
    """A node that cannot be read or patched is an error for the log, never an exception."""
    api = FakeNodeApi()
    api.fail_next = True
    assert "cannot read node" in NodeLabeler(api, "n1").reconcile(WANT).error

    def refuse(*_: Any) -> None:
        raise KubeError("patch node n1: HTTP 403 Forbidden", 403)

    api.patch_node_labels = refuse  # type: ignore[method-assign]
    outcome = NodeLabeler(api, "n1").reconcile(WANT)
    assert "cannot label node n1" in outcome.error and api.node_labels == {}


class _Recorder:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            answer = self.answers.get(name)
            if isinstance(answer, BaseException):
                raise answer
            return answer

        return call


@pytest.mark.timeout(10)
def test_the_kubernetes_adapter_reads_and_patches_node_labels():
    """get_node_metadata reads labels, annotations and version; patch_node_labels sends one merge patch."""
    node = {
        "metadata": {"name": "n1", "resourceVersion": "77", "labels": {"a": "1"}, "annotations": {"b": "2"}}
    }
    core = _Recorder({"read_node": node})
    api = KubernetesNodeApi(client.ApiClient(), "n1", core=core)
    metadata = api.get_node_metadata("n1")
    assert (dict(metadata.labels), dict(metadata.annotations), metadata.resource_version) == (
        {"a": "1"},
        {"b": "2"},
        "77",
    )
    api.patch_node_labels(
        "n1", {SXM_LABEL: "true", NUMA_NODES_LABEL: None}, {MANAGED_LABELS_ANNOTATION: "{}"}, "77"
    )
    name, args, kwargs = core.calls[-1]
    assert name == "patch_node" and args[0] == "n1" and kwargs["_content_type"] == MERGE_PATCH
    assert args[1] == {
        "metadata": {
            "labels": {SXM_LABEL: "true", NUMA_NODES_LABEL: None},
            "annotations": {MANAGED_LABELS_ANNOTATION: "{}"},
            "resourceVersion": "77",
        }
    }
    conflicting = _Recorder({"patch_node": ApiException(status=409, reason="Conflict")})
    api = KubernetesNodeApi(client.ApiClient(), "n1", core=conflicting)
    with pytest.raises(KubeConflict, match="patch node n1 labels: HTTP 409"):
        api.patch_node_labels("n1", {SXM_LABEL: "true"}, {}, "77")


# ---------------------------------------------------------------------- the agent


def _agent(tmp_path, name: str = "hgx-h100", **overrides: Any) -> tuple[Agent, FakeNodeApi, FakeClock]:
    config = AgentConfig(node_name="n1", proc_root=tmp_path, **overrides)
    sim = SimulatedNvml(catalog_machine(name), node_name="n1")
    cluster, clock = FakeNodeApi(), FakeClock()
    text = topo_text(name)
    return Agent(config, sim, cluster, AgentMetrics(), lambda: text, clock), cluster, clock


@pytest.mark.timeout(30)
def test_the_agent_labels_its_node_and_publishes_the_driver(tmp_path):
    """The first poll labels the node, records the labels and publishes the driver and CUDA versions."""
    agent, cluster, _ = _agent(tmp_path)
    cluster.node_labels["nvidia.com/gpu.present"] = "true"  # someone else's: kept
    agent.poll()
    assert cluster.node_labels == {
        "nvidia.com/gpu.present": "true",
        **node_labels(agent.topology, FACTS),
    }
    assert (
        cluster.node_labels[SXM_LABEL] == "true"
        and cluster.node_labels[GPU_PRODUCT_LABEL] == "H100-80GB-HBM3"
    )
    assert set(json.loads(cluster.node_annotations[MANAGED_LABELS_ANNOTATION])) == set(
        node_labels(agent.topology, FACTS)
    )
    assert cluster.status["driver"] == {"version": "550.54.15", "cudaVersion": "12.4"}
    assert cluster.status["labelConflicts"] == [] and not cluster.events


@pytest.mark.timeout(30)
def test_the_agent_reports_a_conflict_once_and_changes_nothing(tmp_path):
    """A label GFD set differently is left, shown in the status and raised as one LabelConflict event."""
    agent, cluster, clock = _agent(tmp_path, name="dgx1-v100")
    cluster.node_labels[GPU_PRODUCT_LABEL] = "Tesla-V100-SXM2-32GB"
    agent.poll()
    assert cluster.node_labels[GPU_PRODUCT_LABEL] == "Tesla-V100-SXM2-32GB"
    assert cluster.status["labelConflicts"] == [
        "node label nvidia.com/gpu.product='Tesla-V100-SXM2-32GB' was not set by the node agent, "
        "which would set 'V100-SXM2-32GB'; left alone"
    ]
    clock.advance(1)
    agent.poll()
    assert [e.reason for e in cluster.events] == ["LabelConflict"] and cluster.events[0].warning
    cluster.label_node({GPU_PRODUCT_LABEL: None})  # GFD went away: the agent takes the label over
    clock.advance(1)
    agent.poll()
    assert (
        cluster.node_labels[GPU_PRODUCT_LABEL] == "V100-SXM2-32GB" and cluster.status["labelConflicts"] == []
    )


@pytest.mark.timeout(30)
def test_the_mps_label_follows_the_daemon_and_labels_can_be_off(tmp_path):
    """linkpack.io/mps turns true when the MPS pipe directory appears; --no-node-labels labels nothing."""
    pipe = tmp_path / "mps"
    agent, cluster, clock = _agent(tmp_path, mps_pipe_dir=str(pipe))
    agent.poll()
    assert cluster.node_labels[MPS_LABEL] == "false"
    pipe.mkdir()
    clock.advance(1)
    agent.poll()
    assert cluster.node_labels[MPS_LABEL] == "true" and cluster.status["mps"] == {"active": True}
    quiet, other, _ = _agent(tmp_path, node_labels=False)
    quiet.poll()
    assert other.node_labels == {} and other.label_patches == []
