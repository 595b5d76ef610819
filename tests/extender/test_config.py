"""Settings come from LINKPACK_* variables; a bad value is named with what was expected."""

from __future__ import annotations

import pytest

from extender.config import ConfigError, config_from_env


def test_defaults_suit_a_production_install() -> None:
    cfg = config_from_env({})
    assert (cfg.namespace, cfg.port, cfg.units_per_gpu, cfg.default_policy) == (
        "linkpack-system",
        8888,
        100,
        "balanced",
    )


def test_policy_weights_can_be_overridden() -> None:
    cfg = config_from_env({"LINKPACK_WEIGHTS_BINPACK": "2,1,3"})
    policy = cfg.policy("binpack")
    assert policy is not None
    assert (policy.weight_link_quality, policy.weight_fragmentation, policy.weight_packing) == (2.0, 1.0, 3.0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LINKPACK_PORT": "http"}, "LINKPACK_PORT='http': expected a whole number"),
        ({"LINKPACK_UNITS_PER_GPU": "0"}, "must be positive"),
        ({"LINKPACK_RESERVATION_TIMEOUT_S": "soon"}, "expected a number"),
        ({"LINKPACK_WEIGHTS_BALANCED": "1,2"}, "expected three numbers"),
        ({"LINKPACK_WEIGHTS_SPREAD": "1,-2,1"}, "must not be negative"),
        ({"LINKPACK_DEFAULT_POLICY": "fastest"}, "not one of"),
    ],
)
def test_a_bad_setting_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_env(env)
