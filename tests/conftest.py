"""Project-wide pytest setup: the real-control-plane fixtures are available to every test."""

from __future__ import annotations

import os
import sys

import pytest

pytest_plugins = ("tests.cluster.fixtures",)

_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without interpreter finalisation once the results are printed.

    gRPC's and the HTTP servers' background threads from the device-plugin and extender tests can
    make CPython abort while it tears modules down, after every test has passed; the run's own
    exit status is what counts, so it is returned directly.
    """
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None or os.environ.get("LINKPACK_NORMAL_EXIT"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
