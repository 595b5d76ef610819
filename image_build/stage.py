"""The stage: everything install_in_root.py installs, made from the checkout, the same for both builds.

    stage/image.toml, install_in_root.py, requirements.lock
    stage/wheels/   linkpack-<version>-py3-none-any.whl (with the generated gRPC stubs) and every
                    wheel of requirements.lock, for the image's Python and platform
    stage/lib/      liblinkpack_cuda.so (`make interposer`)

Build tools (setuptools, grpcio-tools) come from build-requirements.lock into a venv of their
own, cached; so do the downloaded wheels. `python -m image_build stage DIR` makes one (the
Containerfile's first stage does).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from image_build.spec import BUILD_LOCK, INSTALLER, RUNTIME_LOCK, SPEC_FILE, ImageSpec

#: never part of a build's input, wherever they are in a source path
IGNORED = ("__pycache__", "*.pyc", "*.egg-info", "_generated", ".mypy_cache", ".ruff_cache", ".pytest_cache")
_PLATFORM_MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
# glibc of the oldest manylinux tag pip is told the image accepts .. the image's (bookworm: 2.36)
_GLIBC_MINORS = range(36, 16, -1)


def default_cache_dir() -> Path:
    """$LINKPACK_CACHE_DIR, else $XDG_CACHE_HOME/linkpack, else ~/.cache/linkpack; then image/."""
    explicit = os.environ.get("LINKPACK_CACHE_DIR")
    if explicit:
        return Path(explicit) / "image"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "linkpack" / "image"


def _run(argv: list[str | Path], cwd: Path | None = None, extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, **(extra_env or {})}
    done = subprocess.run(
        [str(arg) for arg in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr[-4000:])


def _is_ignored(name: str) -> bool:
    return any(Path(name).match(pattern) for pattern in IGNORED)


def source_files(checkout: Path, spec: ImageSpec) -> list[str]:
    """The files of the checkout the image is built from (relative, sorted)."""
    found: list[str] = []
    for entry in spec.source_paths:
        path = checkout / entry
        if path.is_file():
            found.append(entry)
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"source path {entry!r} of image.toml is not in {checkout}")
        for directory, subdirs, files in os.walk(path):
            subdirs[:] = sorted(d for d in subdirs if not _is_ignored(d))
            found.extend(str(Path(directory, f).relative_to(checkout)) for f in files if not _is_ignored(f))
    return sorted(found)


def source_digest(checkout: Path, spec: ImageSpec) -> str:
    """A hash of every source file's name, mode and contents."""
    digest = hashlib.sha256()
    for name in source_files(checkout, spec):
        path = checkout / name
        digest.update(f"{name}\0{path.stat().st_mode & 0o111:o}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def copy_sources(checkout: Path, spec: ImageSpec, target: Path) -> None:
    for name in source_files(checkout, spec):
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(checkout / name, destination)


def _file_key(*paths: Path) -> str:
    digest = hashlib.sha256(f"{sys.version}\0{sys.platform}".encode())
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def tools_venv(cache: Path) -> Path:
    """A venv with build-requirements.lock installed (cached by the lock and this Python)."""
    venv = cache / "tools" / _file_key(BUILD_LOCK)
    if (venv / ".complete").is_file():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", venv])
    _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "--no-deps", "--require-hashes", "-r", BUILD_LOCK])  # fmt: skip
    (venv / ".complete").touch()
    return venv


def platform_tags(spec: ImageSpec) -> list[str]:
    machine = _PLATFORM_MACHINES.get(spec.architecture)
    if machine is None:
        raise ValueError(f"no wheel platform known for architecture {spec.architecture!r}")
    return [f"manylinux_2_{minor}_{machine}" for minor in _GLIBC_MINORS] + [f"manylinux2014_{machine}"]


def locked_wheels(spec: ImageSpec, cache: Path, python: Path) -> Path:
    """Every wheel of requirements.lock for the image's Python and platform, checked against the
    lock's hashes (downloaded once per lock)."""
    wheelhouse = cache / "wheels" / f"{spec.architecture}-{spec.python}-{_file_key(RUNTIME_LOCK)}"
    if (wheelhouse / ".complete").is_file():
        return wheelhouse
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir(parents=True)
    version = spec.python.replace(".", "")
    _run([python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
          "--require-hashes", "--only-binary=:all:", "--implementation=cp", f"--python-version={spec.python}",
          f"--abi=cp{version}", *(f"--platform={tag}" for tag in platform_tags(spec)),
          "--dest", wheelhouse, "-r", RUNTIME_LOCK])  # fmt: skip
    (wheelhouse / ".complete").touch()
    return wheelhouse


def make_stage(checkout: Path, spec: ImageSpec, stage: Path, cache: Path) -> None:
    """Fill `stage` (created; must not exist or be empty) from the checkout."""
    stage.mkdir(parents=True, exist_ok=True)
    wheels = stage / "wheels"
    wheels.mkdir()
    tools = tools_venv(cache)
    python = tools / "bin" / "python"
    epoch = {"SOURCE_DATE_EPOCH": str(spec.source_date_epoch)}
    with tempfile.TemporaryDirectory(prefix="linkpack-src-") as scratch:
        source = Path(scratch)
        copy_sources(checkout, spec, source)
        _run([python, "-m", "node_agent.deviceplugin.build_proto"], cwd=source)
        _run([python, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
              "--no-build-isolation", "--no-index", "--wheel-dir", wheels, source], extra_env=epoch)  # fmt: skip
        _run(
            ["make", "--no-print-directory", "-C", source, "interposer", f"INTERPOSER_BUILD={stage / 'lib'}"]
        )
    for wheel in sorted(locked_wheels(spec, cache, python).glob("*.whl")):
        shutil.copyfile(wheel, wheels / wheel.name)
    for path in (SPEC_FILE, INSTALLER, RUNTIME_LOCK):
        shutil.copyfile(path, stage / path.name)
