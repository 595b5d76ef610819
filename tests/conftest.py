"""Project-wide pytest setup: the real-control-plane fixtures are available to every test."""

from __future__ import annotations

pytest_plugins = ("tests.cluster.fixtures",)
