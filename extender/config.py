"""Extender settings, read once from the environment (`LINKPACK_*`) with operator-friendly defaults."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from contract.keys import DEFAULT_NAMESPACE, DEFAULT_SCHEDULER_NAME
from contract.resources import ResourceConfigError, ResourceNames, units_per_gpu_from_env
from topology.scheduling import DEFAULT_UNITS_PER_GPU, Policy, PolicyName


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The extender's serving certificate and the CA whose client certificates may call the verbs."""

    cert_file: str
    key_file: str
    client_ca_file: str


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """Everything the extender can be told. Defaults suit a production install."""

    resources: ResourceNames = field(default_factory=ResourceNames)
    namespace: str = DEFAULT_NAMESPACE
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    units_per_gpu: int = DEFAULT_UNITS_PER_GPU
    reservation_timeout_s: float = 120.0
    bind_retries: int = 5
    resync_period_s: float = 300.0
    policies: Mapping[str, Policy] = field(
        default_factory=lambda: {
            PolicyName.BALANCED.value: Policy(PolicyName.BALANCED.value, 1.0, 1.0, 1.0),
            PolicyName.BINPACK.value: Policy(PolicyName.BINPACK.value, 1.0, 1.0, 2.0),
            PolicyName.SPREAD.value: Policy(PolicyName.SPREAD.value, 1.0, 0.5, 1.0, spread=True),
        }
    )
    default_policy: str = PolicyName.BALANCED.value
    # The built-in policies decide the node (filter answers the single best one); a
    # GpuSchedulingPolicy says so itself with spec.decideNode (default true).
    decide_node: bool = True
    host: str = "0.0.0.0"
    port: int = 8888  # the verbs, mutual TLS
    debug_port: int = 8889  # /debug/*, TLS + Kubernetes identity
    ops_port: int = 8890  # /healthz, /readyz, /metrics, plain HTTP
    tls: TlsFiles | None = None  # None only where the caller serves no network (demo, tests)
    debug_access_ttl_s: float = 30.0

    def policy(self, name: str | None) -> Policy | None:
        """The named policy, the default one for None, or None when the name is unknown."""
        return self.policies.get(name or self.default_policy)


N = TypeVar("N", int, float)


class ConfigError(ValueError):
    """A setting has a value the extender cannot use; the message names the variable."""


def config_from_env(env: Mapping[str, str] | None = None) -> ExtenderConfig:
    """Build the configuration from `LINKPACK_*` variables; unknown values raise ConfigError."""
    env = os.environ if env is None else env
    defaults = ExtenderConfig()
    try:
        names = ResourceNames.from_env(env)
        units_per_gpu = units_per_gpu_from_env(env)
    except ResourceConfigError as exc:
        raise ConfigError(str(exc)) from exc
    weights = _weights(env, defaults)
    default_policy = env.get("LINKPACK_DEFAULT_POLICY", defaults.default_policy)
    if default_policy not in weights:
        raise ConfigError(f"LINKPACK_DEFAULT_POLICY={default_policy!r}: not one of {sorted(weights)}")
    return ExtenderConfig(
        resources=names,
        namespace=env.get("LINKPACK_NAMESPACE", defaults.namespace),
        scheduler_name=env.get("LINKPACK_SCHEDULER_NAME", defaults.scheduler_name),
        units_per_gpu=units_per_gpu,
        reservation_timeout_s=_positive_float(
            env, "LINKPACK_RESERVATION_TIMEOUT_S", defaults.reservation_timeout_s
        ),
        bind_retries=_positive_int(env, "LINKPACK_BIND_RETRIES", defaults.bind_retries),
        resync_period_s=_positive_float(env, "LINKPACK_RESYNC_PERIOD_S", defaults.resync_period_s),
        policies=weights,
        default_policy=default_policy,
        decide_node=_flag(env, "LINKPACK_DECIDE_NODE", defaults.decide_node),
        host=env.get("LINKPACK_HOST", defaults.host),
        port=_positive_int(env, "LINKPACK_PORT", defaults.port),
        debug_port=_positive_int(env, "LINKPACK_DEBUG_PORT", defaults.debug_port),
        ops_port=_positive_int(env, "LINKPACK_OPS_PORT", defaults.ops_port),
        tls=_tls(env),
        debug_access_ttl_s=_positive_float(env, "LINKPACK_DEBUG_ACCESS_TTL_S", defaults.debug_access_ttl_s),
    )


TLS_VARIABLES = ("LINKPACK_TLS_CERT_FILE", "LINKPACK_TLS_KEY_FILE", "LINKPACK_CLIENT_CA_FILE")


def _tls(env: Mapping[str, str]) -> TlsFiles | None:
    """All three TLS files, or none of them (then `python -m extender` refuses to start)."""
    given = {k: env.get(k, "").strip() for k in TLS_VARIABLES}
    if not any(given.values()):
        return None
    missing = [k for k, v in given.items() if not v]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not set: the TLS settings go together ({', '.join(TLS_VARIABLES)})"
        )
    return TlsFiles(*given.values())


def _weights(env: Mapping[str, str], defaults: ExtenderConfig) -> dict[str, Policy]:
    """`LINKPACK_WEIGHTS_<POLICY>=link,fragmentation,packing` overrides a policy's weights."""
    policies = dict(defaults.policies)
    for name, policy in list(policies.items()):
        key = f"LINKPACK_WEIGHTS_{name.upper()}"
        if key not in env:
            continue
        parts = env[key].split(",")
        try:
            link, frag, pack = (float(p) for p in parts)
        except ValueError as exc:
            raise ConfigError(
                f"{key}={env[key]!r}: expected three numbers 'link,fragmentation,packing'"
            ) from exc
        if min(link, frag, pack) < 0:
            raise ConfigError(f"{key}={env[key]!r}: weights must not be negative")
        policies[name] = replace(
            policy, weight_link_quality=link, weight_fragmentation=frag, weight_packing=pack
        )
    return policies


def _flag(env: Mapping[str, str], key: str, default: bool) -> bool:
    raw = env.get(key, "").strip().lower()
    if not raw:
        return default
    if raw not in ("true", "false"):
        raise ConfigError(f"{key}={raw!r}: expected true or false")
    return raw == "true"


def _positive_int(env: Mapping[str, str], key: str, default: int) -> int:
    return _positive(env, key, default, int, "a whole number")


def _positive_float(env: Mapping[str, str], key: str, default: float) -> float:
    return _positive(env, key, default, float, "a number")


def _positive(env: Mapping[str, str], key: str, default: N, parse: Callable[[str], N], what: str) -> N:
    raw = env.get(key)
    if raw is None:
        return default
    try:
        value = parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}={raw!r}: expected {what}") from exc
    if value <= 0:
        raise ConfigError(f"{key}={raw!r}: must be positive")
    return value
