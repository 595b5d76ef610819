"""Installing the CUDA interposer beside the framework shim, checking it loads, and the GPU state directory."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from node_agent.sharing.interposer_delivery import (
    INSTALL_SUBDIR,
    LIBRARY_NAME,
    install_interposer,
    interposer_installed,
    load_problem,
    prepare_gpu_state_dir,
    prepare_interposer,
)


@pytest.mark.timeout(10)
def test_install_copies_the_library_once_and_replaces_a_changed_one(tmp_path: Path) -> None:
    """The library is copied into the shim directory's interposer/ readable by all, left alone when unchanged and replaced when it differs."""
    source = tmp_path / "image" / LIBRARY_NAME
    source.parent.mkdir()
    source.write_bytes(b"version 1")
    directory = install_interposer(source, tmp_path / "shim")
    installed = directory / LIBRARY_NAME
    assert directory == tmp_path / "shim" / INSTALL_SUBDIR and installed.read_bytes() == b"version 1"
    assert stat.S_IMODE(installed.stat().st_mode) == 0o644
    inode = installed.stat().st_ino
    install_interposer(source, tmp_path / "shim")
    assert installed.stat().st_ino == inode  # unchanged: not rewritten
    source.write_bytes(b"version 2")
    install_interposer(source, tmp_path / "shim")
    assert installed.read_bytes() == b"version 2" and installed.stat().st_ino != inode  # replaced whole
    assert sorted(p.name for p in directory.iterdir()) == [LIBRARY_NAME]  # no scratch file left
    assert interposer_installed(str(directory)) and not interposer_installed(None)
    assert not interposer_installed(str(tmp_path))


@pytest.mark.timeout(30)
def test_prepare_leaves_the_interposer_out_when_it_cannot_be_delivered(tmp_path: Path) -> None:
    """Without a library, without a shim directory, or with a file that does not load, no interposer directory is handed to the plugins."""
    assert prepare_interposer(None, str(tmp_path / "shim")) is None
    assert prepare_interposer(str(tmp_path / "absent.so"), str(tmp_path / "shim")) is None
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a shared object")
    assert prepare_interposer(str(junk), None) is None
    assert prepare_interposer(str(junk), str(tmp_path / "shim")) is None
    assert load_problem(junk).startswith(f"OSError: {junk}")  # the loader's own words


@pytest.mark.timeout(10)
def test_the_gpu_state_directory_is_made_writable_for_every_container_user(tmp_path: Path) -> None:
    """The GPU state directory is created with mode 1777 so every share container can write its per-GPU files; None leaves it out."""
    made = prepare_gpu_state_dir(str(tmp_path / "a" / "gpu-state"))
    assert made is not None and stat.S_IMODE(Path(made).stat().st_mode) == 0o1777
    assert prepare_gpu_state_dir(None) is None
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert prepare_gpu_state_dir(str(blocker / "gpu-state")) is None
