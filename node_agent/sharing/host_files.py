"""Files the agent hands to containers through host directories (the framework shim, the CUDA
interposer): written atomically and only when they differ, so a container starting meanwhile
never reads half a file."""

from __future__ import annotations

import os
from pathlib import Path


def install_file(destination: Path, data: bytes) -> None:
    """Make `destination` hold `data`, readable by any uid. Raises OSError when it cannot."""
    try:
        if destination.read_bytes() == data:
            return
    except OSError:
        pass  # missing or unreadable: write it
    scratch = destination.with_name(f".{destination.name}.{os.getpid()}.tmp")
    try:
        scratch.write_bytes(data)
        scratch.chmod(0o644)  # read or mapped by container users of any uid
        os.replace(scratch, destination)
    finally:
        scratch.unlink(missing_ok=True)
