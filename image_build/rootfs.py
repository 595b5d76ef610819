"""The Debian root filesystem the image starts from, made by mmdebstrap and cached by its inputs.

`mmdebstrap --variant=apt` (apt's essential set, like debian:bookworm-slim) plus the packages of
image.toml, without manuals, documentation other than copyright files, and translations. The tar
is kept in the cache directory under a hash of everything that decides its contents (the
command line and mmdebstrap's version), and the downloaded .deb files beside it, so a changed
package list does not download everything again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from image_build.spec import ImageSpec

# what debian:*-slim leaves out too
_DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
# merged /usr by symbolic links, as Debian sets it up since bookworm (without the usrmerge
# package, which would bring in perl)
_MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/merged-usr")
#: how many root filesystems the cache keeps (the newest)
KEEP_ROOTFS = 2


class RootfsError(RuntimeError):
    """mmdebstrap is missing or failed."""


def mmdebstrap_arguments(spec: ImageSpec) -> list[str]:
    """The command line that decides the root filesystem's contents (without the .deb cache hooks)."""
    return [
        "mmdebstrap",
        "--variant=apt",
        "--format=tar",
        f"--architectures={spec.architecture}",
        f"--include={','.join(spec.packages)}",
        f"--hook-dir={_MERGED_USR_HOOKS}",
        *(f"--dpkgopt={option}" for option in _DPKG_OPTIONS),
        spec.suite,
    ]


def _mmdebstrap_version() -> str:
    if shutil.which("mmdebstrap") is None:
        raise RootfsError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    done = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def rootfs_key(spec: ImageSpec) -> str:
    """The cache key of the root filesystem: a hash of its command line and mmdebstrap's version."""
    text = "\0".join([_mmdebstrap_version(), str(spec.source_date_epoch), *mmdebstrap_arguments(spec)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def base_rootfs(spec: ImageSpec, cache: Path) -> Path:
    """The root filesystem tar for `spec`, made now when the cache has none for its inputs."""
    directory = cache / "rootfs"
    directory.mkdir(parents=True, exist_ok=True)
    tar = directory / f"{spec.suite}-{rootfs_key(spec)}.tar"
    if tar.is_file():
        os.utime(tar)  # the newest survive pruning
        return tar
    debs = cache / "debs"
    debs.mkdir(exist_ok=True)
    partial = tar.with_name(f".partial-{tar.name}")
    arguments = mmdebstrap_arguments(spec)
    command = [
        *arguments[:-1],
        # reuse and keep the downloaded packages (mmdebstrap's documented cache hooks)
        "--skip=essential/unlink",
        '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
        "--quiet",
        arguments[-1],
        str(partial),
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(spec.source_date_epoch)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RootfsError(f"mmdebstrap failed ({done.returncode}):\n{done.stderr[-4000:]}")
    os.replace(partial, tar)
    _prune(directory, keep=KEEP_ROOTFS)
    return tar


def _prune(directory: Path, keep: int) -> None:
    tars = sorted(directory.glob("[!.]*.tar"), key=lambda path: path.stat().st_mtime, reverse=True)
    for old in tars[keep:]:
        old.unlink(missing_ok=True)


def extract(tar: Path, target: Path) -> None:
    """Unpack a root filesystem tar with its owners, modes and device nodes (needs root)."""
    target.mkdir(parents=True, exist_ok=True)
    command = ["tar", "--extract", "--numeric-owner", "--preserve-permissions", "--file", str(tar),
               "--directory", str(target)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RootfsError(f"cannot unpack {tar}: {done.stderr.strip()}")
