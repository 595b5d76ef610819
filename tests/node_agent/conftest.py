"""Fixtures shared by the node agent tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A kubelet device-plugin directory; under /tmp, since unix socket paths must stay short."""
    path = Path(tempfile.mkdtemp(prefix="lp-dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
