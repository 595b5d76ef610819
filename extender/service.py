"""The extender's verbs as plain methods: parse the body, decide, record, answer.

Each verb takes one cluster snapshot at its start and decides on it alone. The methods are
plain (blocking, CPU-bound) functions: `extender.serving.app` runs them on a thread pool, never on
the event loop, and its route handlers are one line each over this class.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from contract.pods import pod_ref
from extender.binding.binder import Binder
from extender.config import ExtenderConfig
from extender.explain_log import ExplainLog, PodDecisions
from extender.metrics import ExtenderMetrics
from extender.placing.decisions import Decider
from extender.placing.filter_outcome import FilterOutcome
from extender.placing.reuse import Reuse
from extender.state.cluster_api import ClusterApi, WatchHandlers
from extender.state.pod_requests import PodRequest, RequestError, read_pod_request, scheduler_mismatch
from extender.state.store import ClusterStore
from extender.wire import (
    ExtenderArgs,
    WireError,
    binding_result,
    compact_json,
    decode_json,
    filter_result,
    filter_result_json,
    parse_binding_args,
    parse_extender_args,
    priority_list,
    priority_list_for,
    string_map_entries,
)
from topology.scoring import Ranking

SYNC_KINDS = ("nodes", "topologies", "ledgers", "pods", "policies", "namespaces")
_ANSWERS_KEPT = 8  # filter and prioritize answers remembered (a few request kinds at once)

#: A filter outcome's misfits counted by (failed or unresolvable, reason).
Tally = tuple[tuple[tuple[str, str], int], ...]


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
        self.explain = ExplainLog()
        self._answers: Reuse[tuple[tuple[str, ...], list[dict[str, Any]]]] = Reuse(_ANSWERS_KEPT)
        self._filter_json: Reuse[bytes] = Reuse(_ANSWERS_KEPT)
        self._encoded_maps: Reuse[str] = Reuse(2 * _ANSWERS_KEPT)
        self._tallies: Reuse[Tally] = Reuse(_ANSWERS_KEPT)

    # ------------------------------------------------------------------ verbs

    def filter(self, body: object) -> dict[str, Any]:
        """The ExtenderFilterResult for an ExtenderArgs body (decoded JSON).

        When the pod's policy decided the node, the answer names that node alone: kube-scheduler
        drops every node an extender's answer leaves out, and it reads the failed nodes' reasons
        only when no node is left (to say why the pod is pending, and to pick preemption
        candidates), which a decided pod never reaches. At thousands of nodes the reasons would
        be most of the reply, for the scheduler to decode on every pod; the explain log
        (`decisions_for`, /debug) keeps them."""
        decided = self._filter(body)
        if isinstance(decided, dict):
            return decided
        args, outcome = decided
        if outcome.narrowed_from is not None:
            return filter_result(args, outcome.passed, {}, {})
        return filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable)

    def filter_json(self, raw: bytes) -> bytes:
        """`compact_json(self.filter(decode_json(raw)))`, the same bytes, for the verbs server.

        The decider hands out the same outcome while none of the nodes asked about changed, and
        then the bytes are the same too; a new outcome reuses the encoding of the failed nodes'
        reasons it shares with earlier ones."""
        decided = self._filter(decode_json(raw))
        if isinstance(decided, dict):
            return compact_json(decided)
        args, outcome = decided
        if args.nodes is not None:
            return compact_json(filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable))
        known = self._filter_json.get(outcome)
        if known is None:
            known = self._filter_json.put(outcome, self._encoded(outcome))
        return known

    def _filter(self, body: object) -> dict[str, Any] | tuple[ExtenderArgs, FilterOutcome]:
        """Filter's decision (logged and counted), or its whole answer when there is no decision
        to make (a bad body, a pod without a GPU request or with an invalid one)."""
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
            tally = self._tallies.get(outcome.misfits)  # shared by answers narrowed from one outcome
            if tally is None:
                tally = self._tallies.put(outcome.misfits, _misfit_tally(outcome))
            for (kind, reason), n in tally:
                self.metrics.decisions.labels("filter", kind, reason).inc(n)
            self.metrics.decisions.labels("filter", "passed", "").inc(len(outcome.passed))
            return args, outcome

    def _encoded(self, outcome: FilterOutcome) -> bytes:
        if outcome.narrowed_from is not None:  # a decided node: named alone (see `filter`)
            return filter_result_json(outcome.passed, "", "")
        return filter_result_json(
            outcome.passed, self._entries(outcome.failed), self._entries(outcome.unresolvable)
        )

    def _entries(self, mapping: dict[str, str]) -> str:
        """`string_map_entries(mapping)`, remembered while the (never modified) dict is in use."""
        known = self._encoded_maps.get(mapping)
        if known is None:
            known = self._encoded_maps.put(mapping, string_map_entries(mapping))
        return known

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
        known = self._answers.get(ranking)
        if known is not None and known[0] == names:
            return known[1]
        answer = priority_list_for(names, ranking.by_node())
        self._answers.put(ranking, (names, answer))
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
        return self.explain.get(namespace, name)

    def _entry(self, key: str) -> PodDecisions:
        return self.explain.entry(key)


def _misfit_tally(outcome: FilterOutcome) -> Tally:
    """The outcome's misfits counted by (failed or unresolvable, reason), in sorted order."""
    tally: dict[tuple[str, str], int] = {}
    for misfit in outcome.misfits.values():
        key = ("failed" if misfit.resolvable else "unresolvable", misfit.reason.value)
        tally[key] = tally.get(key, 0) + 1
    return tuple(sorted(tally.items()))


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
