"""Pods' GPU asks become requests, and bad asks get a precise reason."""

from __future__ import annotations

from extender.config import ExtenderConfig
from extender.state.pod_requests import PodRequest, RequestError, read_pod_request
from tests.support.pods import container, pod_manifest
from tests.support.resources import SHARED
from topology.scheduling import GpuShare, MigSlice, WholeGpus

CONFIG = ExtenderConfig()


def test_whole_gpus_are_summed_over_containers() -> None:
    pod = pod_manifest(containers=[container(gpus=2), container("side", gpus=1, limits_only=True)])
    parsed = read_pod_request(pod, CONFIG)
    assert isinstance(parsed, PodRequest)
    assert parsed.request == WholeGpus(3)


def test_init_containers_count_by_their_largest_ask() -> None:
    pod = pod_manifest(gpus=1, init_containers=[container("warm", gpus=4, limits_only=True)])
    parsed = read_pod_request(pod, CONFIG)
    assert isinstance(parsed, PodRequest) and parsed.request == WholeGpus(4)


def test_a_share_is_memory_and_units_of_one_gpu() -> None:
    parsed = read_pod_request(pod_manifest(units=25, memory=10240), CONFIG)
    assert isinstance(parsed, PodRequest) and parsed.request == GpuShare(memory_mib=10240, units=25)


def test_a_mig_slice_is_read_from_its_resource_name() -> None:
    parsed = read_pod_request(pod_manifest(mig={"1g.10gb": 1}, limits_only=True), CONFIG)
    assert isinstance(parsed, PodRequest) and parsed.request == MigSlice("1g.10gb")


def test_a_pod_without_gpu_resources_is_not_ours() -> None:
    assert read_pod_request(pod_manifest(limits={"cpu": "2"}, limits_only=True), CONFIG) is None


def test_mixing_whole_gpus_and_shares_is_refused() -> None:
    parsed = read_pod_request(pod_manifest(gpus=1, units=10), CONFIG)
    assert isinstance(parsed, RequestError)
    assert "not several of these at once" in parsed.message


def test_more_units_than_one_gpu_has_is_refused() -> None:
    parsed = read_pod_request(pod_manifest(units=150), CONFIG)
    assert isinstance(parsed, RequestError) and "exceeds one GPU (100 units)" in parsed.message


def test_an_unknown_policy_is_named_with_the_known_ones() -> None:
    parsed = read_pod_request(pod_manifest(gpus=1, policy="fastest"), CONFIG)
    assert isinstance(parsed, RequestError)
    assert "'fastest'" in parsed.message and "balanced, binpack, spread" in parsed.message


def test_a_fractional_quantity_is_refused() -> None:
    parsed = read_pod_request(pod_manifest(gpus="500m", limits_only=True), CONFIG)
    assert isinstance(parsed, RequestError) and "must be a whole number" in parsed.message


def test_resource_names_are_configurable() -> None:
    from extender.config import config_from_env

    cfg = config_from_env({"LINKPACK_RESOURCE_GPU": "example.com/gpu"})
    parsed = read_pod_request(pod_manifest(limits={"example.com/gpu": "2"}, limits_only=True), cfg)
    assert isinstance(parsed, PodRequest) and parsed.request == WholeGpus(2)


def test_a_memory_only_share_is_refused_with_the_fix() -> None:
    """Only share units reach the device plugin; memory alone would leave the container without a GPU."""
    parsed = read_pod_request(pod_manifest(memory=4096), CONFIG)
    assert isinstance(parsed, RequestError)
    assert f"needs at least 1 {SHARED} unit" in parsed.message


def test_quantities_come_back_from_the_api_server_in_canonical_form() -> None:
    """The API server rewrites 900000 as "900k"; 1024 MiB may arrive as "1Ki"; both are whole numbers."""
    from contract.quantity import parse_quantity

    assert parse_quantity("900k") == 900_000
    assert parse_quantity("1Ki") == 1024
    assert parse_quantity("2e3") == 2000
    assert parse_quantity("1500m") * 2 == 3
    parsed = read_pod_request(pod_manifest(units="25", memory="900k", limits_only=True), CONFIG)
    assert isinstance(parsed, PodRequest) and parsed.request == GpuShare(memory_mib=900_000, units=25)


def test_a_quantity_that_is_not_one_is_named() -> None:
    parsed = read_pod_request(pod_manifest(gpus="two", limits_only=True), CONFIG)
    assert isinstance(parsed, RequestError) and "is not a resource quantity" in parsed.message


def test_a_gpu_sidecar_counts_beside_the_app_container() -> None:
    """A 1-GPU sidecar (restartPolicy Always) and a 1-GPU app container need 2 GPUs, as the kubelet
    counts them; granting 1 made the kubelet refuse the pod at admission."""
    sidecar = container("proxy", gpus=1, limits_only=True, restart_policy="Always")
    pod = pod_manifest(gpus=1, init_containers=[sidecar])
    parsed = read_pod_request(pod, CONFIG)
    assert isinstance(parsed, PodRequest) and parsed.request == WholeGpus(2)


def test_a_sidecar_before_an_init_container_runs_beside_it() -> None:
    """A 1-GPU sidecar started before a 2-GPU init container makes that step need 3 GPUs."""
    sidecar = container("proxy", gpus=1, limits_only=True, restart_policy="Always")
    pod = pod_manifest(init_containers=[sidecar, container("prep", gpus=2, limits_only=True)])
    parsed = read_pod_request(pod, CONFIG)
    assert isinstance(parsed, PodRequest) and parsed.request == WholeGpus(3)
