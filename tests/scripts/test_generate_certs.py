"""`scripts/generate-certs.sh`: help, clear errors, certificates that verify, rotation that keeps the
CA and replaces the Secrets."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate-certs.sh"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env or dict(os.environ)
    )


def openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True, timeout=30).stdout


def test_help_prints_the_options_and_succeeds() -> None:
    done = run("--help")
    assert done.returncode == 0 and done.stderr == ""
    assert "--namespace NS" in done.stdout and "--apply" in done.stdout and "--new-ca" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--namespace"], "--namespace needs a value"),
        (["--out", "--apply"], "--out needs a value"),
        (["--days", "soon"], "--days must be a positive whole number"),
        (["--namespace", "Linkpack_System"], "is not a namespace name"),
        (["--rotate"], "unknown argument: --rotate"),
    ],
)
def test_bad_arguments_are_named_with_exit_status_2(args: list[str], message: str, tmp_path: Path) -> None:
    done = run(*args, "--out", str(tmp_path)) if "--out" not in args else run(*args)
    assert done.returncode == 2
    assert message in done.stderr and "unbound variable" not in done.stderr
    assert not (tmp_path / "ca.key").exists()


def test_certificates_verify_against_the_ca_and_name_the_service(tmp_path: Path) -> None:
    """The extender's certificate is for linkpack-extender.NS.svc, the scheduler's is a client
    certificate, both signed by the CA; the output names the folder holding the CA key."""
    done = run("--namespace", "gpu-system", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"the CA key is {tmp_path}/ca.key" in done.stdout
    assert "apply -f -" in done.stdout and "-n gpu-system" in done.stdout
    for leaf in ("extender.crt", "scheduler.crt"):
        assert "OK" in openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / leaf))
    extender = openssl("x509", "-in", str(tmp_path / "extender.crt"), "-noout", "-text")
    assert "DNS:linkpack-extender.gpu-system.svc" in extender and "TLS Web Server Authentication" in extender
    assert "TLS Web Client Authentication" in openssl(
        "x509", "-in", str(tmp_path / "scheduler.crt"), "-noout", "-text"
    )
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


def test_running_again_keeps_the_ca_and_apply_replaces_the_secrets(tmp_path: Path) -> None:
    """A second run into the same folder signs with the CA there; --apply goes through
    `kubectl apply`, which replaces Secrets that exist (a stand-in kubectl records the calls)."""
    out = tmp_path / "ca"
    assert run("--out", str(out)).returncode == 0
    first_ca = (out / "ca.crt").read_bytes()
    first_leaf = (out / "extender.crt").read_bytes()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncat >/dev/null\n')
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = run("--out", str(out), "--apply", env=env)
    assert done.returncode == 0, done.stderr
    assert "Signing with the CA already in" in done.stdout
    assert (out / "ca.crt").read_bytes() == first_ca and (out / "extender.crt").read_bytes() != first_leaf
    recorded = calls.read_text().splitlines()
    assert sum(line.startswith("-n linkpack-system apply -f -") for line in recorded) == 2
    assert any("linkpack-extender-tls" in line for line in recorded)
    assert any("linkpack-scheduler-client" in line for line in recorded)
    assert run("--out", str(out), "--new-ca").returncode == 0
    assert (out / "ca.crt").read_bytes() != first_ca
