"""Writing an OCI image archive (image-layout 1.0.0 in one tar) from a root filesystem directory.

Deterministic: entries sorted by name, every time the image's epoch, owners as numbers with no
names, gzip without name or time; the JSON documents with sorted keys. The same tree gives the
same layer digest, config, manifest and archive, byte for byte.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, cast

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"

#: directories whose contents the runtime provides (mounts): the directory goes in, not what is in it
RUNTIME_DIRS = frozenset({"dev", "proc", "sys", "tmp"})


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>"
    size: int


@dataclass(frozen=True)
class Layer:
    blob: Blob  # the gzip stream
    diff_id: str  # the digest of the uncompressed tar


@dataclass(frozen=True)
class ImageConfig:
    """What the runtime reads from the image config (the OCI names are capitalised in the JSON)."""

    architecture: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[str, ...]
    working_dir: str
    user: str
    labels: tuple[tuple[str, str], ...]
    created_by: str


@dataclass(frozen=True)
class ArchiveResult:
    path: Path
    manifest: Blob
    config: Blob
    layer: Layer


class _Digesting:
    """A write-only stream that hashes and counts what passes through to `target`."""

    def __init__(self, target: BinaryIO | None) -> None:
        self.target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        if self.target is not None:
            self.target.write(data)
        return len(data)

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256.hexdigest()}"


def canonical_json(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def iso_time(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _walk(root: Path, relative: str = "") -> Iterator[tuple[str, Path]]:
    """(name in the tar, path) for everything under `root`, parents before children, names sorted;
    symbolic links are entries, never followed."""
    directory = root / relative if relative else root
    for name in sorted(os.listdir(directory)):
        member = f"{relative}/{name}" if relative else name
        path = root / member
        yield member, path
        if path.is_dir() and not path.is_symlink() and member not in RUNTIME_DIRS:
            yield from _walk(root, member)


def _tarinfo(
    name: str, path: Path, epoch: int, first_links: dict[tuple[int, int], str]
) -> tarfile.TarInfo | None:
    """The tar header for one file, or None for what a layer cannot carry (devices, sockets)."""
    st = path.lstat()
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = epoch
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in first_links:
            info.type = tarfile.LNKTYPE
            info.linkname = first_links[key]
        else:
            if st.st_nlink > 1:
                first_links[key] = name
            info.type = tarfile.REGTYPE
            info.size = st.st_size
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
    else:
        return None
    return info


def write_layer(root: Path, blobs: Path, epoch: int) -> Layer:
    """The gzip'ed tar of the tree under `root`, stored in `blobs` (a blobs/sha256 directory) under
    its digest."""
    blobs.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=blobs, prefix=".layer-", delete=False) as scratch:
        compressed = _Digesting(cast(BinaryIO, scratch))
        with gzip.GzipFile(
            filename="", mode="wb", fileobj=cast(BinaryIO, compressed), mtime=0, compresslevel=6
        ) as gz:
            plain = _Digesting(cast(BinaryIO, gz))
            with tarfile.open(fileobj=cast(BinaryIO, plain), mode="w|", format=tarfile.PAX_FORMAT) as tar:
                first_links: dict[tuple[int, int], str] = {}
                for name, path in _walk(root):
                    info = _tarinfo(name, path, epoch, first_links)
                    if info is None:
                        continue
                    if info.type == tarfile.REGTYPE:
                        with path.open("rb") as content:
                            tar.addfile(info, content)
                    else:
                        tar.addfile(info)
    layer = Layer(blob=Blob(compressed.digest, compressed.size), diff_id=plain.digest)
    os.replace(scratch.name, blobs / compressed.digest.removeprefix("sha256:"))
    return layer


def _put(blobs: Path, document: object) -> Blob:
    data = canonical_json(document)
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return Blob(digest, len(data))


def config_document(config: ImageConfig, layer: Layer, epoch: int) -> dict[str, object]:
    runtime: dict[str, object] = {
        "Entrypoint": list(config.entrypoint),
        "Env": list(config.env),
        "WorkingDir": config.working_dir,
        "User": config.user,
        "Labels": dict(config.labels),
    }
    if config.cmd:
        runtime["Cmd"] = list(config.cmd)
    return {
        "architecture": config.architecture,
        "os": "linux",
        "created": iso_time(epoch),
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
        "history": [{"created": iso_time(epoch), "created_by": config.created_by}],
    }


def _descriptor(media_type: str, blob: Blob) -> dict[str, object]:
    return {"mediaType": media_type, "digest": blob.digest, "size": blob.size}


def _archive_entry(name: str, epoch: int, size: int | None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = epoch
    if size is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.type, info.mode, info.size = tarfile.REGTYPE, 0o644, size
    return info


def write_image_archive(
    root: Path, config: ImageConfig, reference: str, out: Path, epoch: int
) -> ArchiveResult:
    """The OCI archive of one single-layer image of the tree under `root`, named `reference`
    (e.g. docker.io/library/linkpack:0.1.0) for containerd (`ctr images import`) and other tools."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as scratch:
        layout = Path(scratch)
        blobs = layout / "blobs" / "sha256"
        layer = write_layer(root, blobs, epoch)
        config_blob = _put(blobs, config_document(config, layer, epoch))
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": _descriptor(MEDIA_CONFIG, config_blob),
            "layers": [_descriptor(MEDIA_LAYER_GZIP, layer.blob)],
        }
        manifest_blob = _put(blobs, manifest)
        index = {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    **_descriptor(MEDIA_MANIFEST, manifest_blob),
                    "platform": {"architecture": config.architecture, "os": "linux"},
                    "annotations": {REF_NAME: reference, CONTAINERD_NAME: reference},
                }
            ],
        }
        documents = {
            "oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}),
            "index.json": canonical_json(index),
        }
        partial = out.with_name(f".{out.name}.partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in documents.items():
                tar.addfile(_archive_entry(name, epoch, len(data)), io.BytesIO(data))
            tar.addfile(_archive_entry("blobs", epoch, None))
            tar.addfile(_archive_entry("blobs/sha256", epoch, None))
            for blob in sorted(blobs.iterdir()):
                with blob.open("rb") as content:
                    tar.addfile(
                        _archive_entry(f"blobs/sha256/{blob.name}", epoch, blob.stat().st_size), content
                    )
        os.replace(partial, out)
    return ArchiveResult(path=out, manifest=manifest_blob, config=config_blob, layer=layer)
