"""`make image`: the whole build without any container registry, cached.

1. the Debian root filesystem (rootfs.py, mmdebstrap; cached by its inputs),
2. the stage from the checkout (stage.py: the wheel, the locked wheels, the interposer),
3. install_in_root.py run inside that root filesystem (chroot),
4. the OCI archive of the result (oci.py).

The finished archive is cached too, under a hash of every input (the root filesystem's key, the
source files, the locks, image.toml): `build()` with unchanged inputs returns at once. One build
at a time per cache directory (a file lock), so parallel callers wait and then share the result.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from image_build.oci import ImageConfig, write_image_archive
from image_build.rootfs import base_rootfs, extract, rootfs_key
from image_build.spec import PACKAGE_DIR, ImageSpec, load_spec
from image_build.stage import default_cache_dir, make_stage, source_digest

log = logging.getLogger("image_build")

REPO_ROOT = PACKAGE_DIR.parent
DEFAULT_OUT_DIR = REPO_ROOT / "build" / "image"
#: where the stage is put inside the root filesystem while install_in_root.py runs
STAGE_IN_ROOT = "tmp/linkpack-stage"
#: how many finished archives the cache keeps (the newest)
KEEP_ARCHIVES = 3


class BuildError(RuntimeError):
    """A step of the image build failed; the message says which and why."""


def image_config(spec: ImageSpec) -> ImageConfig:
    return ImageConfig(
        architecture=spec.architecture,
        entrypoint=spec.entrypoint,
        cmd=spec.cmd,
        env=spec.env,
        working_dir=spec.workdir,
        user=spec.user,
        labels=(
            ("org.opencontainers.image.title", "linkpack"),
            ("org.opencontainers.image.version", spec.tag),
        ),
        created_by=f"python -m image_build: Debian {spec.suite} (mmdebstrap) and Linkpack {spec.tag}",
    )


def inputs_key(checkout: Path, spec: ImageSpec) -> str:
    """A hash of everything the archive is made from (the sources include the locks, image.toml
    and this builder)."""
    text = "\0".join([rootfs_key(spec), source_digest(checkout, spec)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_in_root(root: Path, argv: list[str], epoch: int) -> None:
    """Run `argv` chrooted into `root` with a clean environment (needs root)."""
    env = [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
        "DEBIAN_FRONTEND=noninteractive",
        f"SOURCE_DATE_EPOCH={epoch}",
    ]
    command = ["chroot", str(root), "/usr/bin/env", "-i", *env, *argv]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv)} in the root filesystem failed ({done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")  # fmt: skip


def assemble(checkout: Path, spec: ImageSpec, cache: Path, out: Path) -> None:
    """Build the archive at `out` from scratch (but the cached root filesystem and tools)."""
    if os.geteuid() != 0:
        raise BuildError("make image needs root (it unpacks a root filesystem and chroots into it)")
    log.info("root filesystem: Debian %s by mmdebstrap (cached by its inputs)", spec.suite)
    base = base_rootfs(spec, cache)
    work = cache / "work"
    work.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        root = Path(scratch) / "rootfs"
        extract(base, root)
        stage = root / STAGE_IN_ROOT
        log.info("stage: the wheel, the gRPC stubs, the locked wheels, the interposer")
        try:
            make_stage(checkout, spec, stage, cache)
        except subprocess.CalledProcessError as exc:
            raise BuildError(f"staging failed: {' '.join(exc.cmd)}:\n{exc.stderr}") from exc
        log.info("installing into the root filesystem (install_in_root.py)")
        run_in_root(root, ["python3", f"/{STAGE_IN_ROOT}/install_in_root.py", f"/{STAGE_IN_ROOT}"],
                    spec.source_date_epoch)  # fmt: skip
        shutil.rmtree(stage)
        log.info("writing the OCI archive")
        write_image_archive(root, image_config(spec), spec.reference, out, spec.source_date_epoch)


def _place(cached: Path, out: Path) -> None:
    """Make `out` the cached archive: a hard link where possible, else a copy."""
    if out.exists() and os.path.samefile(out, cached):
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(cached, partial)
    except OSError:
        shutil.copyfile(cached, partial)
    os.replace(partial, out)


def _prune(directory: Path, keep: int) -> None:
    archives = sorted(directory.glob("*.oci.tar"), key=lambda path: path.stat().st_mtime, reverse=True)
    for old in archives[keep:]:
        old.unlink(missing_ok=True)


def build(
    out_dir: Path | str = DEFAULT_OUT_DIR,
    *,
    checkout: Path = REPO_ROOT,
    cache_dir: Path | None = None,
    reuse: bool = True,
) -> Path:
    """The image archive `<out_dir>/linkpack-<tag>.oci.tar`, built when the cache has none for the
    current inputs (`reuse=False`: build it anyway, replacing the cached one). Returns its path."""
    spec = load_spec()
    cache = cache_dir or default_cache_dir()
    archives = cache / "archives"
    with _cache_lock(cache):
        cached = archives / f"{inputs_key(checkout, spec)}.oci.tar"
        if reuse and cached.is_file():
            log.info("cached: %s", cached)
            os.utime(cached)
        else:
            assemble(checkout, spec, cache, cached)
            _prune(archives, KEEP_ARCHIVES)
        out = Path(out_dir) / spec.archive_name
        _place(cached, out)
    return out
