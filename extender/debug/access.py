"""Who may read the debug endpoints: a Kubernetes identity with an explicit RBAC permission.

The kube-rbac-proxy pattern, inside the extender: the caller presents a bearer token
(`Authorization: Bearer ...`, or `X-Linkpack-Authorization` when the request comes through the
API server's service proxy, which drops `Authorization`); the API server says who it belongs to
(TokenReview) and whether that identity may use the endpoint (SubjectAccessReview on the
virtual resource `debug` of the `linkpack.io` group, subresource `topology`, `explain` or
`what-if`). Answers are remembered for `ttl_s` so a page reload costs no API calls.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from extender.state.cluster_api import AccessReviewer, ApiError, Identity

DEBUG_GROUP = "linkpack.io"
DEBUG_RESOURCE = "debug"
TOKEN_HEADERS = ("authorization", "x-linkpack-authorization")


@dataclass(frozen=True, slots=True)
class Denied:
    """Why a debug request is refused: `status` 401 (who are you?) or 403 (not allowed)."""

    status: int
    message: str


def debug_subresource(path: str) -> str | None:
    """The RBAC subresource guarding a debug path; None for a path that is not a debug endpoint."""
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "debug" and parts[1] in ("topology", "explain", "what-if"):
        return parts[1]
    return None


def bearer_token(headers: dict[str, str]) -> str | None:
    for name in TOKEN_HEADERS:
        value = headers.get(name, "")
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


class DebugAccess:
    """Decides, per request, whether the caller may use a debug endpoint."""

    def __init__(
        self, reviewer: AccessReviewer, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._reviewer = reviewer
        self._ttl = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._identities: dict[str, tuple[float, Identity | None]] = {}
        self._decisions: dict[tuple[str, str, str], tuple[float, bool, str]] = {}

    def check(self, headers: dict[str, str], method: str, path: str) -> Identity | Denied:
        subresource = debug_subresource(path)
        if subresource is None:
            return Denied(404, f"no debug endpoint at {path}")
        token = bearer_token(headers)
        if token is None:
            return Denied(
                401,
                "the debug endpoints need a Kubernetes identity: send 'Authorization: Bearer <token>' "
                "(kubectl linkpack does this with the token of your kubeconfig)",
            )
        verb = "get" if method.upper() in ("GET", "HEAD") else "create"
        try:
            identity = self._identity(token)
            if identity is None:
                return Denied(401, "the API server does not accept this token (TokenReview)")
            allowed, reason = self._allowed(token, identity, verb, subresource)
        except ApiError as exc:
            return Denied(503, f"cannot check the caller with the API server: {exc}")
        if not allowed:
            why = f": {reason}" if reason else ""
            return Denied(
                403,
                f"{identity.username} may not {verb} {DEBUG_RESOURCE}/{subresource} in API group "
                f"{DEBUG_GROUP}{why} (grant it with the ClusterRole linkpack-debug-reader)",
            )
        return identity

    def _identity(self, token: str) -> Identity | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            hit = self._identities.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        identity = self._reviewer.review_token(token)
        with self._lock:
            self._forget_old(now)
            self._identities[key] = (now, identity)
        return identity

    def _allowed(self, token: str, identity: Identity, verb: str, subresource: str) -> tuple[bool, str]:
        key = (hashlib.sha256(token.encode()).hexdigest(), verb, subresource)
        now = self._clock()
        with self._lock:
            hit = self._decisions.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1], hit[2]
        allowed, reason = self._reviewer.review_access(
            identity, verb, DEBUG_GROUP, DEBUG_RESOURCE, subresource
        )
        with self._lock:
            self._decisions[key] = (now, allowed, reason)
        return allowed, reason

    def _forget_old(self, now: float) -> None:
        if len(self._identities) < 1024:
            return
        self._identities = {k: v for k, v in self._identities.items() if now - v[0] < self._ttl}
        self._decisions = {k: v for k, v in self._decisions.items() if now - v[0] < self._ttl}
