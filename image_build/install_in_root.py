"""Install Linkpack into the root filesystem this runs in: the last step of both image builds.

Run as root with the image's own Python (`python3 install_in_root.py STAGE`), inside a chroot of
the Debian root filesystem (`make image`) or in the Containerfile's final stage. STAGE is the
directory `python -m image_build stage` filled: image.toml, requirements.lock, wheels/ (the
project's wheel and every locked dependency) and lib/liblinkpack_cuda.so. Nothing is downloaded
here: pip installs from wheels/ only, each locked wheel checked against its hash.

Standard library only, no import of the image_build package: this file is copied into the
root filesystem and run there on its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

Spec = dict[str, Any]  # image.toml as tomllib reads it

# Logs and caches the installation itself writes (with the time of the build in them): removed,
# so that the same inputs give the same files.
_BUILD_LEFTOVERS = (
    "/var/log/dpkg.log",
    "/var/log/alternatives.log",
    "/var/log/apt/history.log",
    "/var/log/apt/term.log",
    "/var/log/apt/eipp.log.xz",
    "/var/cache/ldconfig/aux-cache",
    "/var/cache/debconf/config.dat-old",
    "/var/cache/debconf/templates.dat-old",
    "/var/lib/dpkg/status-old",
    "/var/lib/dpkg/diversions-old",
    "/etc/passwd-",
    "/etc/group-",
    "/etc/shadow-",
    "/etc/gshadow-",
)


def run(*argv: str) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def install_venv(stage: Path, spec: Spec) -> Path:
    """The venv with the locked dependencies and the project's wheel; pip itself is removed."""
    venv = Path(spec["paths"]["venv"])
    if venv.exists():
        shutil.rmtree(venv)
    run(sys.executable, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    pip = (python, "-m", "pip", "--no-cache-dir", "--disable-pip-version-check", "--no-input")
    offline = ("--no-index", "--find-links", str(stage / "wheels"))
    run(*pip, "install", *offline, "--no-deps", "--require-hashes", "-r", str(stage / "requirements.lock"))
    run(*pip, "install", *offline, "--no-deps", f"linkpack=={spec['tag']}")
    run(*pip, "check")
    run(*pip, "uninstall", "--yes", "pip", "setuptools")
    return venv


def write_launchers(venv: Path, spec: Spec) -> None:
    """`python -m <module>` launchers for the commands that are no console script of the wheel; the
    console scripts must be there already."""
    for command in spec["commands"]:
        path = venv / "bin" / command["name"]
        if "module" in command:
            path.write_text(f'#!/bin/sh\nexec {venv}/bin/python -m {command["module"]} "$@"\n')
            path.chmod(0o755)
        elif not path.is_file():
            raise SystemExit(
                f"console script {command['name']} is not in the wheel (pyproject [project.scripts])"
            )


def install_interposer(stage: Path, spec: Spec) -> None:
    target = Path(spec["paths"]["interposer"])
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(stage / "lib" / target.name, target)
    target.chmod(0o644)


def add_user(spec: Spec) -> None:
    """The unprivileged user, written into the account files directly (no password ever set)."""
    user = spec["user"]
    name, uid, gid = user["name"], user["uid"], user["gid"]
    lines = {
        "/etc/passwd": f"{name}:x:{uid}:{gid}:Linkpack:/nonexistent:/usr/sbin/nologin",
        "/etc/group": f"{name}:x:{gid}:",
        "/etc/shadow": f"{name}:!:::::::",
        "/etc/gshadow": f"{name}:!::",
    }
    for path, line in lines.items():
        file = Path(path)
        text = file.read_text() if file.exists() else ""
        if any(entry.split(":", 1)[0] == name for entry in text.splitlines()):
            continue
        file.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line + "\n")


def remove_build_packages(spec: Spec) -> None:
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\n", *spec["base"]["remove_after"]],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if installed:
        run("dpkg", "--purge", *installed)


def remove_leftovers() -> None:
    for path in _BUILD_LEFTOVERS:
        Path(path).unlink(missing_ok=True)
    for directory in ("/var/lib/apt/lists", "/var/cache/apt", "/root/.cache"):
        shutil.rmtree(directory, ignore_errors=True)
    Path("/var/lib/apt/lists/partial").mkdir(parents=True)
    Path("/var/cache/apt/archives/partial").mkdir(parents=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: {sys.argv[0]} STAGE_DIR", file=sys.stderr)
        return 2
    stage = Path(argv[0])
    spec = tomllib.loads((stage / "image.toml").read_text())
    os.umask(0o022)
    # pip compiles the wheels' modules with it: hash-based .pyc files, no build time in them
    os.environ["SOURCE_DATE_EPOCH"] = str(spec["source_date_epoch"])
    venv = install_venv(stage, spec)
    write_launchers(venv, spec)
    install_interposer(stage, spec)
    Path(spec["paths"]["workdir"]).mkdir(parents=True, exist_ok=True)
    add_user(spec)
    remove_build_packages(spec)
    remove_leftovers()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
