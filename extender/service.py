"""The extender's verbs as plain methods: parse the body, decide, record, answer.

Each verb takes one cluster snapshot at its start and decides on it alone. The methods are
plain (blocking, CPU-bound) functions: `extender.app` runs them on a thread pool, never on
the event loop, and its route handlers are one line each over this class.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.pods import pod_ref
from extender.binder import Binder
from extender.cluster_api import ClusterApi, WatchHandlers
from extender.cluster_store import ClusterStore
from extender.config import ExtenderConfig
from extender.decisions import Decider, FilterOutcome
from extender.metrics import ExtenderMetrics
from extender.pod_requests import PodRequest, RequestError, read_pod_request, scheduler_mismatch
from extender.wire import (
    WireError,
    binding_result,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    priority_list,
    priority_list_for,
)
from topology.scoring import Ranking

SYNC_KINDS = ("nodes", "topologies", "ledgers", "pods", "policies", "namespaces")
_LOG_LIMIT = 2048
_ANSWERS_KEPT = 8  # prioritize answers remembered (a few request kinds at once)


@dataclass
class PodDecisions:
    """The last filter, prioritize and bind outcome seen for one pod (for /debug/explain)."""

    request: PodRequest | RequestError | None = None
    filtered: FilterOutcome | None = None
    ranking: Ranking | None = None
    bound_node: str = ""
    bind_error: str = ""
    at: float = field(default_factory=time.time)


class ExtenderService:
    def __init__(
        self,
        config: ExtenderConfig,
        api: ClusterApi,
        store: ClusterStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.api = api
        self.store = store or ClusterStore(config.units_per_gpu)
        self.decider = Decider(self.store)
        self.binder = Binder(api, self.store, config, clock)
        self.metrics = ExtenderMetrics(
            lambda: self.store.snapshot().node_states(),
            lambda: self.store.snapshot().gpu_nodes_without_topology(),
        )
        self._log: OrderedDict[str, PodDecisions] = OrderedDict()
        self._log_lock = threading.Lock()
        self._answers: list[tuple[Ranking, tuple[str, ...], list[dict[str, Any]]]] = []

    # ------------------------------------------------------------------ verbs

    def filter(self, body: object) -> dict[str, Any]:
        with self.metrics.latency.labels("filter").time():
            try:
                args = parse_extender_args(body)
            except WireError as exc:
                return {
                    "Nodes": None,
                    "NodeNames": None,
                    "FailedNodes": {},
                    "FailedAndUnresolvableNodes": {},
                    "Error": str(exc),
                }
            snapshot = self.store.snapshot()
            parsed = read_pod_request(args.pod, self.config, snapshot.book)
            log = self._entry(pod_ref(args.pod).key)
            wrong_scheduler = scheduler_mismatch(args.pod, self.config.scheduler_name)
            if wrong_scheduler and parsed is not None:
                parsed = RequestError(pod_ref(args.pod), wrong_scheduler)
            log.request = parsed
            if parsed is None:
                return filter_result(args, args.node_names, {}, {})
            if isinstance(parsed, RequestError):
                self.metrics.decisions.labels("filter", "unresolvable", "invalid request").inc()
                return filter_result(args, (), {}, {n: parsed.message for n in args.node_names})
            outcome = self.decider.filter(snapshot, parsed, args.node_names)
            log.filtered = outcome
            tally: dict[tuple[str, str], int] = {}
            for misfit in outcome.misfits.values():
                key = ("failed" if misfit.resolvable else "unresolvable", misfit.reason.value)
                tally[key] = tally.get(key, 0) + 1
            for (kind, reason), n in sorted(tally.items()):
                self.metrics.decisions.labels("filter", kind, reason).inc(n)
            self.metrics.decisions.labels("filter", "passed", "").inc(len(outcome.passed))
            return filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable)

    def prioritize(self, body: object) -> list[dict[str, Any]]:
        with self.metrics.latency.labels("prioritize").time():
            try:
                args = parse_extender_args(body)
            except WireError:
                return []
            snapshot = self.store.snapshot()
            parsed = read_pod_request(args.pod, self.config, snapshot.book)
            if not isinstance(parsed, PodRequest):
                return priority_list([(n, 0) for n in args.node_names])
            ranking = self.decider.prioritize(snapshot, parsed, args.node_names)
            self._entry(parsed.pod.key).ranking = ranking
            return self._answer_for(ranking, args.node_names)

    def bind(self, body: object) -> dict[str, str]:
        with self.metrics.latency.labels("bind").time():
            try:
                args = parse_binding_args(body)
            except WireError as exc:
                return binding_result(str(exc))
            log = self._entry(f"{args.pod_namespace}/{args.pod_name}")
            known = log.request if isinstance(log.request, PodRequest) else None
            # Binds to one node that arrive together share one ledger write (the binder's group
            # commit) instead of losing the compare-and-swap to each other; binds from another
            # process still meet the compare-and-swap.
            result = self.binder.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node, known)
            if result.error:
                log.bind_error = result.error
                self.metrics.bind_failures.labels(_first_words(result.error)).inc()
                if result.rolled_back:
                    self.metrics.rollbacks.labels("bind failed").inc()
                self.metrics.decisions.labels("bind", "error", _first_words(result.error)).inc()
            else:
                log.bound_node, log.bind_error = args.node, ""
                self.metrics.decisions.labels("bind", "bound", "").inc()
            if result.attempts > 1:
                self.metrics.bind_conflicts.inc(result.attempts - 1)
            return binding_result(result.error)

    def _answer_for(self, ranking: Ranking, names: tuple[str, ...]) -> list[dict[str, Any]]:
        """The HostPriorityList for `names` under `ranking`. The decider hands out the same
        Ranking while none of the nodes changed, and then the answer is the same list too (it
        is never modified after it is built), which spares rebuilding thousands of entries."""
        with self._log_lock:
            for i, (known, known_names, answer) in enumerate(self._answers):
                if known is ranking and known_names == names:
                    self._answers.append(self._answers.pop(i))
                    return answer
        answer = priority_list_for(names, ranking.by_node())
        with self._log_lock:
            self._answers.append((ranking, names, answer))
            del self._answers[:-_ANSWERS_KEPT]
        return answer

    # ------------------------------------------------------------------ views

    def ready(self) -> bool:
        """True once the initial list of every watched kind is in (what /readyz reports, so a
        Service sends a replica traffic only when its view of the cluster is complete)."""
        return not self.waiting_for()

    def waiting_for(self) -> tuple[str, ...]:
        """The watched kinds whose initial list is not in yet."""
        synced = self.store.snapshot().synced
        return tuple(kind for kind in SYNC_KINDS if kind not in synced)

    def decisions_for(self, namespace: str, name: str) -> PodDecisions | None:
        with self._log_lock:
            return self._log.get(f"{namespace}/{name}")

    def _entry(self, key: str) -> PodDecisions:
        with self._log_lock:
            entry = self._log.pop(key, None) or PodDecisions()
            entry.at = time.time()
            self._log[key] = entry
            while len(self._log) > _LOG_LIMIT:
                self._log.popitem(last=False)
            return entry


def _first_words(message: str) -> str:
    """A low-cardinality label from an error message (drop names after the first colon)."""
    head = message.split(":", 1)[-1].strip() if ":" in message else message
    return head[:60]


def handlers_for(service: ExtenderService) -> WatchHandlers:
    """The watch callbacks that feed `service`'s store."""
    s = service.store
    return WatchHandlers(
        node=s.apply_node,
        node_deleted=s.remove_node,
        topology=s.apply_topology,
        ledger=s.apply_ledger,
        ledger_deleted=s.remove_ledger,
        pod=s.apply_pod,
        pod_deleted=s.remove_pod,
        synced=s.mark_synced,
        policy=s.apply_policy,
        policy_deleted=s.remove_policy,
        namespace=s.apply_namespace,
        namespace_deleted=s.remove_namespace,
        pods_revision=s.apply_pods_revision,
    )
