"""Group commit: binds to one node that arrive together share one ledger write, and nothing
they guarantee alone is lost (each pod its own GPUs, misfits named, conflicts re-planned)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from contract.ledger import Ledger
from extender.binding.binder import BindResult, Committed, PendingBind
from extender.binding.group_commit import GroupCommit
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.pod_requests import PodRequest, read_pod_request
from tests.support.machines import hgx_h100
from tests.support.pods import pod_manifest
from topology.accounting import accumulate

pytestmark = pytest.mark.timeout(60)


class _GatedCommit:
    """A commit function that records its batches and holds the first one until released."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, key: str, items: Sequence[int]) -> list[int]:
        self.batches.append((key, list(items)))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(10)
        return [i * 10 for i in items]


def _wait_until_queued(group: GroupCommit[Any, Any], key: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if group.waiting(key) >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"{count} callers never queued on {key}")


def test_a_lone_bind_commits_at_once_by_itself() -> None:
    """With the node idle the caller leads its own batch of one and gets its own outcome."""
    commit = _GatedCommit()
    commit.release.set()
    group: GroupCommit[int, int] = GroupCommit(commit)
    assert group.submit("node-a", 3) == 30
    assert commit.batches == [("node-a", [3])]
    assert group.busy_keys == frozenset()


def test_callers_arriving_during_a_commit_share_the_next_one() -> None:
    """Five binds that arrive while the first commits are committed together in one second
    batch, each answered with its own outcome."""
    commit = _GatedCommit()
    group: GroupCommit[int, int] = GroupCommit(commit)
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(group.submit, "node-a", 0)
        assert commit.entered.wait(10)
        rest = [pool.submit(group.submit, "node-a", i) for i in range(1, 6)]
        _wait_until_queued(group, "node-a", 5)
        commit.release.set()
        assert first.result(10) == 0
        assert [f.result(10) for f in rest] == [10, 20, 30, 40, 50]
    assert [sorted(items) for _, items in commit.batches] == [[0], [1, 2, 3, 4, 5]]
    assert (group.batches, group.items) == (2, 6)


def test_a_busy_node_never_holds_up_another_node() -> None:
    """While node-a's commit is held, a bind to node-b commits and returns."""
    commit = _GatedCommit()
    group: GroupCommit[int, int] = GroupCommit(commit)
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(group.submit, "node-a", 1)
        assert commit.entered.wait(10)
        assert pool.submit(group.submit, "node-b", 2).result(10) == 20
        commit.release.set()
        assert held.result(10) == 10


def test_batches_are_capped_and_the_lead_passes_on() -> None:
    """With max_batch 2, seven waiting binds are committed two at a time, in arrival order."""
    commit = _GatedCommit()
    group: GroupCommit[int, int] = GroupCommit(commit, max_batch=2)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(group.submit, "n", 0)
        assert commit.entered.wait(10)
        futures = []
        for i in range(1, 8):
            futures.append(pool.submit(group.submit, "n", i))
            _wait_until_queued(group, "n", i)
        commit.release.set()
        assert first.result(10) == 0 and [f.result(10) for f in futures] == [i * 10 for i in range(1, 8)]
    assert [items for _, items in commit.batches] == [[0], [1, 2], [3, 4], [5, 6], [7]]


def test_a_commit_that_raises_fails_its_batch_and_the_queue_goes_on() -> None:
    """A bug in one commit reaches every caller of that batch; the next bind commits normally."""
    calls = []

    def commit(key: str, items: Sequence[int]) -> list[int]:
        calls.append(list(items))
        if len(calls) == 1:
            raise RuntimeError("boom")
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(commit)
    with pytest.raises(RuntimeError, match="boom"):
        group.submit("n", 1)
    assert group.submit("n", 2) == 2


def test_a_commit_answering_the_wrong_number_of_outcomes_is_a_bug() -> None:
    """An outcome list that does not match the batch is raised, not silently zipped short."""
    group: GroupCommit[int, int] = GroupCommit(lambda key, items: [])
    with pytest.raises(RuntimeError, match="0 outcomes for 1 items"):
        group.submit("n", 1)


def test_max_batch_must_be_positive() -> None:
    """A batch cap of zero would never commit anything: refused at construction."""
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(lambda key, items: list(items), max_batch=0)


# ---------------------------------------------------------------------- the binder's batches


class _WatchedApi:
    """The cluster as the binder's API, counting ledger writes; `before_first_write` runs once,
    just before the first write reaches the cluster (a rival replica committing meanwhile)."""

    def __init__(
        self, cluster: InMemoryCluster, before_first_write: Callable[[], None] | None = None
    ) -> None:
        self._cluster = cluster
        self._before = before_first_write
        self.ledger_writes = 0

    def write_ledger(self, ledger: Ledger) -> Ledger:
        if self._before is not None:
            before, self._before = self._before, None
            before()
        self.ledger_writes += 1
        return self._cluster.write_ledger(ledger)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


def _watched(config: ExtenderConfig, cluster: InMemoryCluster, api: _WatchedApi) -> ExtenderService:
    """A service over `cluster` whose every API call goes through `api` (the writes counted)."""
    service = ExtenderService(config, api)  # type: ignore[arg-type]  # the cluster's interface, counted
    cluster.run_watches(handlers_for(service), lambda: True)
    return service


def _pending(service: ExtenderService, cluster: InMemoryCluster, name: str, **ask: int) -> PendingBind:
    created = cluster.create_pod(pod_manifest(name, **ask))
    parsed = read_pod_request(created, service.config, service.store.snapshot().book)
    assert isinstance(parsed, PodRequest)
    return PendingBind(parsed, already_bound=False)


def test_one_batch_of_binds_is_one_ledger_write_with_disjoint_gpus(
    cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """Four pods (1, 2, 4 and 1 GPUs) committed as one batch: one write holding all four, each
    planned after the ones before it, so no GPU is granted twice."""
    api = _WatchedApi(cluster)
    service = _watched(config, cluster, api)
    batch = [
        _pending(service, cluster, "a", gpus=1),
        _pending(service, cluster, "b", gpus=2),
        _pending(service, cluster, "c", gpus=4),
        _pending(service, cluster, "d", gpus=1),
    ]
    outcomes = service.binder.commit_batch("nv-node", batch)
    assert all(isinstance(o, Committed) and o.written and o.attempts == 1 for o in outcomes)
    assert api.ledger_writes == 1
    ledger = cluster.read_ledger("nv-node")
    assert sorted(e.name for e in ledger.entries) == ["a", "b", "c", "d"]
    assert sorted(g.index for g in ledger.grants()) == list(range(8))
    assert accumulate(hgx_h100(), list(ledger.grants()), config.units_per_gpu)[1] == ()


def test_a_pod_that_no_longer_fits_is_named_and_the_rest_commit(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """An 8-GPU pod first takes the node; the 1-GPU pod behind it in the batch gets its misfit
    and the ledger holds only the first."""
    batch = [_pending(service, cluster, "big", gpus=8), _pending(service, cluster, "late", gpus=1)]
    big, late = service.binder.commit_batch("nv-node", batch)
    assert isinstance(big, Committed)
    assert isinstance(late, BindResult) and late.error.startswith("node nv-node: ")
    assert [e.name for e in cluster.read_ledger("nv-node").entries] == ["big"]


def test_a_conflicting_batch_is_replanned_on_the_fresh_ledger(
    cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """Another replica commits a 4-GPU pod between this batch's planning and its write: the
    write conflicts, the batch is re-planned on the API's ledger, and every GPU is granted once."""
    other = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(other), lambda: True)
    rival = _pending(other, cluster, "rival", gpus=4)

    def rival_commits() -> None:
        assert isinstance(other.binder.commit_batch("nv-node", [rival])[0], Committed)

    api = _WatchedApi(cluster, rival_commits)
    service = _watched(config, cluster, api)
    batch = [_pending(service, cluster, f"p{i}", gpus=2) for i in range(2)]
    outcomes = service.binder.commit_batch("nv-node", batch)
    assert all(isinstance(o, Committed) and o.attempts == 2 for o in outcomes)
    assert api.ledger_writes == 2
    ledger = cluster.read_ledger("nv-node")
    assert sorted(e.name for e in ledger.entries) == ["p0", "p1", "rival"]
    assert sorted(g.index for g in ledger.grants()) == list(range(8))


def test_concurrent_binds_to_one_node_share_writes_and_all_bind(
    cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """Eight 1-GPU pods bound from eight threads at once: all bound on eight distinct GPUs, in
    no more ledger writes than binds."""
    api = _WatchedApi(cluster)
    service = _watched(config, cluster, api)
    pods = [cluster.create_pod(pod_manifest(f"t{i}", gpus=1)) for i in range(8)]

    def bind(created: dict[str, Any]) -> str:
        m = created["metadata"]
        args = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": "nv-node"}
        return str(service.bind(args)["Error"])

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(bind, pods)) == [""] * 8
    ledger = cluster.read_ledger("nv-node")
    assert sorted(g.index for g in ledger.grants()) == list(range(8))
    assert service.binder.group.items == 8
    assert api.ledger_writes == service.binder.group.batches <= 8
