"""The hypothesis settings every fuzz test runs under: seeded, no example database, no deadline."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings


def fuzz(max_examples: int) -> settings:
    """Derandomized (the same examples on every run and machine), nothing written to .hypothesis/,
    no per-example deadline (the sandbox and the pytest timeout bound the time instead), and no
    explain phase (it can take longer than the search on a failure)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # no explain
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
