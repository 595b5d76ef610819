"""The built image (make image), read back from its archive and run: its layout, its config, and
the commands of the extender, the node agent and kubectl-linkpack inside its root filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest

from image_build import build
from image_build.oci import write_layer
from image_build.spec import ImageSpec
from node_agent.deviceplugin.plugin_host import SHIM_FILES
from tests.image.conftest import run_in_image
from tests.image.oci_checks import ReadImage, read_archive

# the first test to ask for the image may build it: minutes on a fresh cache
pytestmark = [pytest.mark.image, pytest.mark.timeout(1500)]

SITE_PACKAGES = "lib/python{python}/site-packages"


def site_packages(root: Path, spec: ImageSpec) -> Path:
    return root / spec.venv.lstrip("/") / SITE_PACKAGES.format(python=spec.python)


def test_the_archive_is_a_valid_oci_image_named_linkpack(image: ReadImage, spec: ImageSpec) -> None:
    """Every descriptor checks out (read_archive) and the image carries image.toml's name and
    runtime config."""
    assert image.reference == spec.reference == "docker.io/library/linkpack:0.1.0"
    runtime = image.config["config"]
    assert isinstance(runtime, dict)
    assert runtime["Entrypoint"] == list(spec.entrypoint)
    assert runtime["Env"] == list(spec.env)
    assert runtime["User"] == spec.user and runtime["WorkingDir"] == spec.workdir
    assert image.config["architecture"] == spec.architecture and image.config["os"] == "linux"


def test_the_same_inputs_give_the_same_digest(image_archive: Path, image: ReadImage) -> None:
    """A second build of unchanged inputs is the cached archive (no work), named the same."""
    again = build(image_archive.parent)
    assert again == image_archive
    assert read_archive(again).manifest_digest == image.manifest_digest


def test_the_layer_round_trips_through_the_writer(
    image_root: Path, image: ReadImage, spec: ImageSpec, tmp_path: Path
) -> None:
    """The image's root filesystem, unpacked and packed again, gives the very same layer: the
    layer loses nothing an unpacking keeps (owners, modes, links), and the writer is
    deterministic on a real tree."""
    layer = write_layer(image_root, tmp_path / "blobs", spec.source_date_epoch)
    rootfs = image.config["rootfs"]
    assert isinstance(rootfs, dict)
    assert rootfs["diff_ids"] == [layer.diff_id]
    assert layer.blob.size == len(image.layers[0])


@pytest.mark.parametrize("command", ["linkpack-extender", "linkpack-node-agent", "kubectl-linkpack"])
def test_each_command_runs_as_the_image_user(image_root: Path, image: ReadImage, command: str) -> None:
    """`<command> --help` exits 0 as the unprivileged user, from PATH: its dependencies import."""
    done = run_in_image(image_root, image, [command, "--help"])
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("module", ["extender", "node_agent"])
def test_the_manifests_python_dash_m_commands_run(image_root: Path, image: ReadImage, module: str) -> None:
    """`python -m extender` / `python -m node_agent`, the manifests' commands, find the venv's
    Python first on PATH."""
    done = run_in_image(image_root, image, ["python", "-m", module, "--help"], user="0:0")
    assert done.returncode == 0, done.stderr


def test_the_generated_grpc_stubs_and_the_node_agent_wiring_import(
    image_root: Path, image: ReadImage
) -> None:
    """The stubs `make proto` generates are in the wheel and match the locked grpcio and
    protobuf (the generated code checks both versions when imported)."""
    code = (
        "import node_agent.deviceplugin._generated, node_agent.deviceplugin._generated.deviceplugin_pb2_grpc, "
        "node_agent.deviceplugin._generated.podresources_pb2_grpc, node_agent.wiring, extender.serving.app"
    )
    done = run_in_image(image_root, image, ["python", "-c", code])
    assert done.returncode == 0, done.stderr


def test_the_interposer_loads_and_the_shim_files_are_there(
    image_root: Path, image: ReadImage, spec: ImageSpec
) -> None:
    """liblinkpack_cuda.so is where --interposer-lib expects it and loads (switched off, as the
    agent checks it); the shim files the agent copies to containers are in the package."""
    library = image_root / spec.interposer.lstrip("/")
    assert library.is_file()
    load = f"import ctypes; ctypes.CDLL({spec.interposer!r})"
    done = run_in_image(image_root, image, ["env", "LINKPACK_INTERPOSER=off", "python", "-c", load])
    assert done.returncode == 0, done.stderr
    shim = site_packages(image_root, spec) / "node_agent" / "sharing" / "shim"
    assert sorted(path.name for path in shim.iterdir() if path.suffix == ".py") == sorted(
        ["__init__.py", *SHIM_FILES]
    )


def test_the_image_has_the_user_and_no_build_tools(image_root: Path, spec: ImageSpec) -> None:
    """The unprivileged user exists; no compiler, no pip, no venv tooling is left in the image."""
    passwd = (image_root / "etc" / "passwd").read_text().splitlines()
    assert f"{spec.user_name}:x:{spec.uid}:{spec.gid}:Linkpack:/nonexistent:/usr/sbin/nologin" in passwd
    for absent in ("usr/bin/gcc", "usr/bin/cc", "usr/bin/make", "usr/bin/pip3"):
        assert not (image_root / absent).exists(), absent
    packages = site_packages(image_root, spec)
    assert not list(packages.glob("pip*")) and not list(packages.glob("setuptools*"))
    assert not (image_root / "usr/share/python-wheels").exists()
    assert not list((image_root / "tmp").iterdir())
