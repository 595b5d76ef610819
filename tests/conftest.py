"""Project-wide pytest setup: test tiers and their timeouts; the real-control-plane fixtures.

Every test belongs to a tier, selectable with `-m`: `cluster`, `node`, `kubelet`, `image` and `gpu`
are marked by their modules; everything else is `unit`, marked here. A test without its own
`timeout` marker gets its tier's default (the longest of its tiers' where it has several), so a
hang in a unit test fails in a minute, not in the five a real cluster may need. `--timeout` on
the command line still applies to every test.
"""

from __future__ import annotations

import pytest

pytest_plugins = ("tests.cluster.fixtures",)

#: The marked tiers; a test in none of them is a unit test.
MARKED_TIERS = ("cluster", "node", "kubelet", "image", "gpu")

#: Default timeout per tier, seconds, for a whole test (setup, call, teardown). Measured on 2
#: cores with binaries and the image cached (slowest test, whole tier):
TIER_TIMEOUT_S = {
    "unit": 60,  # about 10 s (the chromium page, the topo parser fuzzers); the tier about 3 min
    "gpu": 120,  # NVML queries on one real GPU (not measured here: no GPU)
    "cluster": 300,  # about 55 s (a module's installation set up, a 200-pod burst); the tier 3-6 min
    "kubelet": 600,  # a few s each, the tier under 2 min; the module sets 1800 (a first harness build)
    "node": 600,  # about 30 s, the churn run about 130 s; modules set 600, and 900 for the churn
    "image": 1500,  # about 50 s from the cache; the modules set 1500 (a build from scratch)
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark unmarked tests `unit` before `-m` selects, and give each test its tier's timeout."""
    timeout_given = config.getoption("timeout", default=None) is not None
    for item in items:
        tiers = [tier for tier in MARKED_TIERS if item.get_closest_marker(tier) is not None]
        if not tiers:
            item.add_marker(pytest.mark.unit)
            tiers = ["unit"]
        if not timeout_given and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max(TIER_TIMEOUT_S[tier] for tier in tiers)))
