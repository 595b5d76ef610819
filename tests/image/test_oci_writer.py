"""The OCI archive writer on small trees: layout, determinism, and what a layer carries."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

from image_build.oci import ImageConfig, write_image_archive
from tests.image.oci_checks import read_archive

EPOCH = 1700000000
CONFIG = ImageConfig(
    architecture="amd64",
    entrypoint=("linkpack-extender",),
    cmd=(),
    env=("PATH=/opt/linkpack/venv/bin:/usr/bin:/bin", "LANG=C.UTF-8"),
    working_dir="/opt/linkpack",
    user="65532:65532",
    labels=(("org.opencontainers.image.version", "0.1.0"),),
    created_by="test",
)
REFERENCE = "docker.io/library/linkpack:0.1.0"


def small_tree(root: Path) -> Path:
    """A root filesystem in miniature: files, an executable, a symlink, a hard link, a fifo, and
    runtime directories with something in them."""
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("linkpack\n")
    tool = root / "usr" / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    os.link(tool, root / "usr" / "bin" / "tool-again")
    (root / "bin").symlink_to("usr/bin")
    os.mkfifo(root / "etc" / "pipe")
    for runtime in ("dev", "proc", "tmp"):
        (root / runtime).mkdir()
        (root / runtime / "leftover").write_text("not for the layer")
    return root


def layer_members(archive: Path) -> list[tarfile.TarInfo]:
    (layer,) = read_archive(archive).layers
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        return tar.getmembers()


def test_the_archive_is_a_valid_oci_layout_named_for_containerd(tmp_path: Path) -> None:
    """index.json names the image for containerd and by ref.name; every blob matches its
    descriptor's digest, size and media type; the config carries the runtime settings."""
    out = write_image_archive(small_tree(tmp_path / "root"), CONFIG, REFERENCE, tmp_path / "a.oci.tar", EPOCH)
    image = read_archive(out.path)
    assert image.reference == REFERENCE
    assert image.manifest_digest == out.manifest.digest
    runtime = image.config["config"]
    assert isinstance(runtime, dict)
    assert runtime["Entrypoint"] == ["linkpack-extender"]
    assert runtime["User"] == "65532:65532" and runtime["WorkingDir"] == "/opt/linkpack"
    assert runtime["Env"] == list(CONFIG.env)
    assert "Cmd" not in runtime  # no default arguments
    assert image.config["created"] == "2023-11-14T22:13:20Z"


def test_the_same_tree_gives_the_same_bytes_whenever_it_is_written(tmp_path: Path) -> None:
    """Two trees with the same contents but different file times give the same archive."""
    first = small_tree(tmp_path / "one")
    second = small_tree(tmp_path / "two")
    os.utime(second / "etc" / "hostname", (1, 1))
    a = write_image_archive(first, CONFIG, REFERENCE, tmp_path / "a.oci.tar", EPOCH)
    b = write_image_archive(second, CONFIG, REFERENCE, tmp_path / "b.oci.tar", EPOCH)
    assert a.manifest == b.manifest and a.layer == b.layer
    assert a.path.read_bytes() == b.path.read_bytes()


def test_a_layer_keeps_links_and_modes_and_leaves_out_what_the_runtime_mounts(tmp_path: Path) -> None:
    """Entries are sorted with parents first, carry the fixed time and numeric owners only;
    the hard link is a link to the first name; dev, proc and tmp are empty directories."""
    out = write_image_archive(small_tree(tmp_path / "root"), CONFIG, REFERENCE, tmp_path / "a.oci.tar", EPOCH)
    members = {member.name: member for member in layer_members(out.path)}
    names = list(members)
    assert names == sorted(names, key=lambda name: name.split("/"))
    assert {"dev", "proc", "tmp"} <= set(names)
    assert not [name for name in names if name.startswith(("dev/", "proc/", "tmp/"))]
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    assert members["usr/bin/tool"].isfile() and members["usr/bin/tool"].mode == 0o755
    assert members["usr/bin/tool-again"].islnk() and members["usr/bin/tool-again"].linkname == "usr/bin/tool"
    assert members["etc/pipe"].isfifo()
    assert {member.mtime for member in members.values()} == {EPOCH}
    assert {(member.uname, member.gname) for member in members.values()} == {("", "")}


def test_a_changed_file_changes_the_digest(tmp_path: Path) -> None:
    """One byte more in one file: another layer, another manifest."""
    first = small_tree(tmp_path / "one")
    second = small_tree(tmp_path / "two")
    (second / "etc" / "hostname").write_text("linkpack!\n")
    a = write_image_archive(first, CONFIG, REFERENCE, tmp_path / "a.oci.tar", EPOCH)
    b = write_image_archive(second, CONFIG, REFERENCE, tmp_path / "b.oci.tar", EPOCH)
    assert a.layer.diff_id != b.layer.diff_id and a.manifest != b.manifest
