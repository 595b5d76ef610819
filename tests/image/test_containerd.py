"""The image archive in a real containerd (Debian's package): imported as a node would import it,
listed under its name, and run by runc with its own config (entry point, user, PATH, read-only)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from image_build.spec import ImageSpec
from tests.image.debian_packages import PackagesUnavailable, ensure_commands
from tests.image.oci_checks import ReadImage

pytestmark = [pytest.mark.image, pytest.mark.timeout(1500)]

NAMESPACE = "k8s.io"  # the kubelet's namespace


def _config(directory: Path) -> str:
    """Everything of this containerd under `directory`; no CRI (no kubelet talks to it here)."""
    return f"""version = 2
root = "{directory}/root"
state = "{directory}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{directory}/containerd.sock"
[ttrpc]
  address = "{directory}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
"""


def _unmount_below(directory: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{directory}/")), reverse=True):
        subprocess.run(["umount", mount], check=False)


@pytest.fixture
def containerd() -> Iterator[list[str]]:
    """A throwaway containerd; yields the `ctr` command line that talks to it. Stopped by its pid."""
    try:
        ensure_commands("containerd", "ctr")
    except PackagesUnavailable as exc:
        pytest.fail(f"no containerd to import the image into: {exc}")
    directory = Path(tempfile.mkdtemp(prefix="lp-containerd-"))  # short: a socket path has a limit
    (directory / "config.toml").write_text(_config(directory))
    log = (directory / "containerd.log").open("w")
    process = subprocess.Popen(
        ["containerd", "--config", str(directory / "config.toml")], stdout=log, stderr=log
    )
    ctr = ["ctr", "--address", str(directory / "containerd.sock"), "--namespace", NAMESPACE]
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([*ctr, "version"], capture_output=True, check=False).returncode != 0:
            assert process.poll() is None, (directory / "containerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "containerd did not serve within 60 s"
            time.sleep(0.5)
        yield ctr
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        _unmount_below(directory)
        shutil.rmtree(directory, ignore_errors=True)


def _ctr(ctr: list[str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ctr, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_containerd_imports_the_archive_and_runs_its_commands(
    containerd: list[str], image_archive: Path, image: ReadImage, spec: ImageSpec
) -> None:
    """`ctr images import` names the image docker.io/library/linkpack:<tag> with the archive's
    manifest digest; run with the image's own config on a read-only root, the default entry point
    is the extender (which refuses to start without its TLS files), as the unprivileged user in
    the working directory with the venv first on PATH, and the node agent's command runs too."""
    imported = _ctr(containerd, "images", "import", str(image_archive))
    assert imported.returncode == 0, imported.stderr
    listed = _ctr(containerd, "images", "ls")
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [(row[0], row[2]) for row in rows] == [(spec.reference, image.manifest_digest)]

    def run(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return _ctr(containerd, "run", "--rm", "--read-only", spec.reference, name, *argv)

    default = run("lp-default")
    assert default.returncode == 2, default.stdout + default.stderr
    assert "LINKPACK_TLS_CERT_FILE" in default.stdout + default.stderr
    where = run("lp-where", "sh", "-c", 'id -u; id -g; pwd; command -v python; echo "$PATH"')
    assert where.returncode == 0, where.stderr
    assert where.stdout.splitlines() == [
        str(spec.uid),
        str(spec.gid),
        spec.workdir,
        f"{spec.venv}/bin/python",
        f"{spec.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ]
    agent = run("lp-agent", "python", "-m", "node_agent", "--help")
    assert agent.returncode == 0, agent.stderr
    assert "--interposer-lib" in agent.stdout
