"""The image, built (or taken from the cache) once per session, and its root filesystem unpacked
from the archive itself, to run its commands in."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from image_build import build
from image_build.spec import ImageSpec, load_spec
from tests.image.debian_packages import PackagesUnavailable, ensure_commands
from tests.image.oci_checks import ReadImage, read_archive


def ensure_build_prerequisites() -> None:
    """Skip without root (no image can be built); install mmdebstrap, a C compiler and make when
    missing, and fail when that does not work."""
    if os.geteuid() != 0:
        pytest.skip("building the image needs root (it unpacks a root filesystem and chroots into it)")
    try:
        ensure_commands("mmdebstrap", "cc", "make")
    except PackagesUnavailable as exc:
        pytest.fail(f"cannot build the image: {exc}")


@pytest.fixture(scope="session")
def spec() -> ImageSpec:
    return load_spec()


@pytest.fixture(scope="session")
def image_archive() -> Path:
    ensure_build_prerequisites()
    return build()


@pytest.fixture(scope="session")
def image(image_archive: Path) -> ReadImage:
    return read_archive(image_archive)


@pytest.fixture(scope="session")
def image_root(image: ReadImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's root filesystem, unpacked from its layer with owners and modes."""
    root = tmp_path_factory.mktemp("image-root")
    root.chmod(0o755)  # a container's root directory, as the snapshotter makes it
    (layer,) = image.layers
    layer_file = root.parent / "layer.tar.gz"
    layer_file.write_bytes(layer)
    subprocess.run(["tar", "--extract", "--gzip", "--numeric-owner", "--preserve-permissions",
                    "--file", str(layer_file), "--directory", str(root)], check=True)  # fmt: skip
    layer_file.unlink()
    return root


def run_in_image(
    root: Path, image: ReadImage, argv: list[str], user: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`argv` in the unpacked image as a container would run it: chrooted, as the image's user
    (or `user`), in its working directory, with its environment only."""
    runtime = image.config["config"]
    assert isinstance(runtime, dict)
    userspec = user or runtime["User"]
    command = ["chroot", f"--userspec={userspec}", str(root), "/usr/bin/env", "-i",
               f"--chdir={runtime['WorkingDir']}", *runtime["Env"], *argv]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
