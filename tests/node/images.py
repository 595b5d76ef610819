"""OCI images built here, without any registry: a pause image and a small test image.

Both are made from Debian's statically linked busybox (`busybox-static`, one binary that is
every tool): the layer holds `/bin/busybox`, a link per applet the tests use and the empty
directories a container runtime mounts over. `write_oci_archive` writes an OCI image layout
(oci-layout, index.json naming the image, content-addressed blobs) as one uncompressed tar,
the form `ctr images import` reads; an image built elsewhere (`make image`) in that form is
imported the same way (`RealNode.import_image`).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PAUSE_IMAGE = "linkpack.local/pause:1"
TEST_IMAGE = "linkpack.local/busybox:1"
#: Where Debian's busybox-static puts its binary.
BUSYBOX_PATHS = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
APPLETS = ("sh", "sleep", "env", "cat", "echo", "ls", "true", "date")
_EMPTY_DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp", "run", "var")
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar"


class ImageError(RuntimeError):
    """An image could not be built; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class ImageSpec:
    name: str  # e.g. linkpack.local/busybox:1
    cmd: tuple[str, ...]
    env: tuple[str, ...] = ("PATH=/bin",)


def find_busybox() -> Path:
    for path in BUSYBOX_PATHS:
        if path.is_file():
            return path
    found = shutil.which("busybox")
    if found:
        return Path(found)
    raise ImageError("no busybox binary: install Debian's busybox-static package")


def _deterministic(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def busybox_layer(busybox: Path) -> bytes:
    """An uncompressed layer tar: /bin/busybox, its applet links and the runtime's mount points."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in _EMPTY_DIRS:
            info = _deterministic(tarfile.TarInfo(directory))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = _deterministic(tarfile.TarInfo("bin/busybox"))
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            link = _deterministic(tarfile.TarInfo(f"bin/{applet}"))
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(link)
    return buffer.getvalue()


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def write_oci_archive(spec: ImageSpec, layers: Sequence[bytes], target: Path) -> Path:
    """Write the image as an OCI layout tar at `target` (layers uncompressed, bottom first)."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": list(spec.cmd), "Env": list(spec.env), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer) for layer in layers]},
    }
    config_blob = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST,
        "config": {"mediaType": _CONFIG, "digest": _digest(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": _LAYER, "digest": _digest(b), "size": len(b)} for b in layers],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True).encode()
    tag = spec.name.rpartition(":")[2]
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": _MANIFEST,
                "digest": _digest(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": spec.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    files: list[tuple[str, bytes]] = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    for blob in (config_blob, manifest_blob, *layers):
        files.append((f"blobs/sha256/{_digest(blob).removeprefix('sha256:')}", blob))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = _deterministic(tarfile.TarInfo(directory))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in dict(files).items():
            info = _deterministic(tarfile.TarInfo(name))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return target


def build_test_images(directory: Path) -> tuple[Path, ...]:
    """The pause image (sleeps forever) and the test image (a shell), as OCI archives."""
    layer = busybox_layer(find_busybox())
    pause = ImageSpec(PAUSE_IMAGE, ("/bin/sleep", "2147483647"))
    shell = ImageSpec(TEST_IMAGE, ("/bin/sh",))
    return (
        write_oci_archive(pause, [layer], directory / "pause.tar"),
        write_oci_archive(shell, [layer], directory / "busybox.tar"),
    )
