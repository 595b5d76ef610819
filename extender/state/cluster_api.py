"""What the extender needs from Kubernetes, as a Protocol over our own types.

`extender.kube.client` implements it over the real API; `extender.kube.in_memory` implements it in memory
for the demo and for fast tests. Errors are our own three kinds, never client exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from contract.gpu_topology import PublishedTopology
from contract.ledger import Ledger
from contract.scheduling_policy import SchedulingPolicy
from extender.state.snapshot import NodeFacts, TrackedPod


class ApiError(Exception):
    """The API refused or failed a call; the message says which call and why."""


class ApiConflict(ApiError):
    """A precondition (resourceVersion or uid) did not hold: re-read and try again."""


class ApiNotFound(ApiError):
    """The object does not exist (any more)."""


@dataclass(frozen=True, slots=True)
class PodObject:
    """A pod read fresh from the API: our view of it plus its manifest for request parsing."""

    tracked: TrackedPod
    resource_version: str
    manifest: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class WatchHandlers:
    """Callbacks the watch loops feed; each kind also reports when its first list is in."""

    node: Callable[[NodeFacts], None]
    node_deleted: Callable[[str], None]
    topology: Callable[[str, PublishedTopology | None, str], None]  # node, object, problem
    ledger: Callable[[Ledger], None]
    ledger_deleted: Callable[[str], None]
    pod: Callable[[TrackedPod], None]
    pod_deleted: Callable[[str], None]
    synced: Callable[[str], None]
    policy: Callable[[str, SchedulingPolicy | None, str], None]  # name, policy or None, problem
    policy_deleted: Callable[[str], None]
    namespace: Callable[[str, str | None], None]  # name, default policy it names
    namespace_deleted: Callable[[str], None]
    #: the resourceVersion up to which every pod event has been applied (`contract.handoff`)
    pods_revision: Callable[[str], None] = lambda revision: None


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a bearer token belongs to, as the API server's TokenReview says."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class AccessReviewer(Protocol):
    def review_token(self, token: str) -> Identity | None:
        """The identity of a bearer token; None when the API server does not authenticate it."""
        ...

    def review_access(
        self, identity: Identity, verb: str, group: str, resource: str, subresource: str
    ) -> tuple[bool, str]:
        """Whether `identity` may `verb` the (cluster-scoped) resource, and the API's reason."""
        ...


class ClusterApi(AccessReviewer, Protocol):
    def read_pod(self, namespace: str, name: str) -> PodObject: ...

    def read_ledger(self, node: str) -> Ledger: ...

    def write_ledger(self, ledger: Ledger) -> Ledger:
        """Store `ledger` if the stored one is still at `ledger.resource_version` ("" = absent).

        Returns the ledger at its new resourceVersion; raises ApiConflict otherwise. The caller
        applies the returned ledger to its store itself: the watch may leave out its own echo of
        this very version (the Kubernetes adapter does, to spare rebuilding the node twice).
        """
        ...

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        resource_version: str,
        node: str,
        annotations: Mapping[str, str],
    ) -> None:
        """Create the pod's Binding with uid and resourceVersion preconditions and these annotations."""
        ...

    def emit_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, warning: bool
    ) -> None: ...

    def nudge_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        """Set `linkpack.io/capacity-freed` on a pending pod so that kube-scheduler tries it again
        (best effort: failures are logged, never raised)."""
        ...

    def run_watches(self, handlers: WatchHandlers, stop: Callable[[], bool]) -> None:
        """List and watch everything the extender tracks until `stop()` is true (blocking)."""
        ...
