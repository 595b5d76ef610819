"""Pytest fixtures for tests against a real control plane; load with
`pytest_plugins = ("tests.cluster.fixtures",)` in tests/conftest.py.

- `k8s_binaries` (session): kube-apiserver/kube-scheduler built for the pinned release, etcd
  installed if missing. The first build takes minutes; build ahead with
  `python -m tests.cluster.binaries`.
- `control_plane` (session): one running `ControlPlane` (etcd + kube-apiserver) shared by all
  tests; no scheduler runs unless a test starts one (`start_scheduler`, stop it when done).
- `linkpack_crd` (session): namespace.yaml, both CRDs and rbac.yaml created on the control
  plane, the CRDs Established.
- `cluster_namespace` (function): a fresh namespace whose pods are deleted afterwards.

When a test that used the control plane fails, the control plane keeps its directory and prints
the tail of every process log at the end of the session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator

import pytest

from tests.cluster.binaries import Binaries, ensure_binaries
from tests.cluster.controlplane import (
    MANIFESTS,
    ControlPlane,
    load_manifest,
    temporary_namespace,
    wait_for_crd,
)

CRD_NAME = "gputopologies.linkpack.io"
POLICY_CRD_NAME = "gpuschedulingpolicies.linkpack.io"
_CONTROL_PLANE_KEY = pytest.StashKey[ControlPlane]()


def pytest_configure(config: pytest.Config) -> None:
    # Clients of the test API server skip verification of its self-signed certificate.
    config.addinivalue_line("filterwarnings", "ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(scope="session")
def k8s_binaries(request: pytest.FixtureRequest) -> Binaries:
    # Let build progress reach the terminal instead of pytest's capture.
    capture = request.config.pluginmanager.getplugin("capturemanager")
    quiet = capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext()
    with quiet:
        return ensure_binaries()


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest, k8s_binaries: Binaries) -> Iterator[ControlPlane]:
    with ControlPlane(k8s_binaries) as cp:
        request.config.stash[_CONTROL_PLANE_KEY] = cp
        try:
            yield cp
        finally:
            del request.config.stash[_CONTROL_PLANE_KEY]


@pytest.fixture(scope="session")
def linkpack_crd(control_plane: ControlPlane) -> ControlPlane:
    objects = []
    for name in ("namespace.yaml", "crd-gputopology.yaml", "crd-gpuschedulingpolicy.yaml", "rbac.yaml"):
        objects += load_manifest(MANIFESTS / name)
    control_plane.create_objects(objects, exist_ok=True)
    wait_for_crd(control_plane.api_client(), CRD_NAME)
    wait_for_crd(control_plane.api_client(), POLICY_CRD_NAME)
    return control_plane


@pytest.fixture
def cluster_namespace(control_plane: ControlPlane) -> Iterator[str]:
    with temporary_namespace(control_plane.api_client()) as name:
        yield name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and "control_plane" in getattr(item, "fixturenames", ()):
        cp = item.config.stash.get(_CONTROL_PLANE_KEY, None)
        if cp is not None:
            cp.mark_failed()
    return report
