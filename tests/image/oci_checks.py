"""Reading an OCI image archive back as a client would, checking every descriptor on the way."""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from image_build.oci import (
    CONTAINERD_NAME,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER_GZIP,
    MEDIA_MANIFEST,
    REF_NAME,
)


@dataclass(frozen=True)
class ReadImage:
    reference: str
    manifest_digest: str
    config: dict[str, object]
    layers: tuple[bytes, ...]  # the gzip'ed layer blobs


def _sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _blob(members: dict[str, bytes], descriptor: dict[str, object], media_type: str) -> bytes:
    assert descriptor["mediaType"] == media_type, descriptor
    digest = descriptor["digest"]
    assert isinstance(digest, str) and digest.startswith("sha256:"), descriptor
    data = members[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    assert len(data) == descriptor["size"], (
        f"{digest}: {len(data)} bytes, descriptor says {descriptor['size']}"
    )
    assert _sha256(data) == digest, f"{digest}: contents hash to {_sha256(data)}"
    return data


def read_archive(path: Path) -> ReadImage:
    """The one image of the archive, after checking the layout: oci-layout, index.json, every
    blob's digest, size and media type, and each layer's diff_id against its uncompressed tar."""
    with tarfile.open(path) as tar:
        members = {}
        for member in tar.getmembers():
            if member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                members[member.name] = handle.read()
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(members["index.json"])
    assert index["schemaVersion"] == 2 and index["mediaType"] == MEDIA_INDEX
    (entry,) = index["manifests"]
    reference = entry["annotations"][REF_NAME]
    assert entry["annotations"][CONTAINERD_NAME] == reference
    manifest = json.loads(_blob(members, entry, MEDIA_MANIFEST))
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == MEDIA_MANIFEST
    config = json.loads(_blob(members, manifest["config"], MEDIA_CONFIG))
    layers = tuple(_blob(members, layer, MEDIA_LAYER_GZIP) for layer in manifest["layers"])
    diff_ids = [_sha256(gzip.decompress(layer)) for layer in layers]
    assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
    assert entry["platform"] == {"architecture": config["architecture"], "os": config["os"]}
    referenced = {
        f"blobs/sha256/{d['digest'].removeprefix('sha256:')}"
        for d in [entry, manifest["config"], *manifest["layers"]]
    }
    assert set(members) - {"oci-layout", "index.json"} == referenced, "blobs nothing refers to"
    return ReadImage(reference=reference, manifest_digest=entry["digest"], config=config, layers=layers)
