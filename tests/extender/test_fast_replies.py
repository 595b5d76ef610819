"""The warm request path: remembered decisions and pre-encoded replies give the same bytes as
deciding and encoding from scratch."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from contract.allocation import Allocation
from contract.compute_demand import ComputeDemand
from contract.gpu_topology import as_published
from contract.ledger import Ledger, LedgerEntry
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.placing import reference
from extender.placing.reuse import Reuse
from extender.service import ExtenderService, handlers_for
from extender.serving.verbs import verb_routes
from extender.state.pod_requests import PodRequest
from extender.state.snapshot import ClusterSnapshot, NodeFacts
from extender.wire import (
    compact_json,
    filter_result,
    filter_result_json,
    parse_extender_args,
    string_map_entries,
)
from tests.support.pods import pod_manifest
from topology.catalog import load_machine
from topology.node_choice import choose_node
from topology.placement import place
from topology.scheduling import GpuShare, Placement, Request, WholeGpus
from topology.scoring import RawTerms, default_fragmentation

pytestmark = pytest.mark.timeout(120)

MACHINES = ("hgx-h100", "dgx-a100", "dgx1-v100", "pcie-nv12-pairs", "rtx3090-2socket")


def _fleet(config: ExtenderConfig, nodes: int = 30) -> InMemoryCluster:
    """Nodes of five machine shapes (one without a topology) under mixed load."""
    rng = random.Random(7)
    cluster = InMemoryCluster(config)
    allocatable = ComputeDemand(96_000, 1024 * 1024)
    for i in range(nodes):
        name = f"node-{i:03d}"
        base = load_machine(MACHINES[i % len(MACHINES)])
        topology = replace(base, gpus=tuple(replace(g, uuid=f"GPU-{name}-{g.index}") for g in base.gpus))
        cluster.add_node(
            NodeFacts(name, allocatable=allocatable), None if i == 3 else as_published(name, topology)
        )
    service = _service(config, cluster)
    for i in range(nodes):
        for k in range(rng.randint(0, 4)):
            _bind(
                cluster,
                service,
                f"node-{i:03d}",
                rng.choice((WholeGpus(1), WholeGpus(2), GpuShare(25, 8192))),
                k,
            )
    return cluster


def _service(config: ExtenderConfig, cluster: InMemoryCluster) -> ExtenderService:
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    return service


def _bind(cluster: InMemoryCluster, service: ExtenderService, node: str, request: Request, k: object) -> None:
    """Commit `request` on `node` to its ledger, as a bind does (nothing when it does not fit)."""
    entry = service.store.snapshot().node(node)
    if entry is None or entry.state is None:
        return
    found = place(entry.state, request)
    if not isinstance(found, Placement):
        return
    ledger = cluster.read_ledger(node)
    grant = LedgerEntry(f"{node}-{k}", "load", f"{node}-{k}", Allocation(node, found.grants), 0.0)
    cluster.write_ledger(Ledger(node, (*ledger.entries, grant), ledger.resource_version))


def _reference_terms(snapshot: ClusterSnapshot, node: str, pod: PodRequest) -> RawTerms | None:
    """The pod's scoring terms on `node` as the plain reference computes them from scratch."""
    outcome = reference.node_outcome(snapshot, node, pod)
    return reference.scoring_terms(snapshot, node, pod, outcome, default_fragmentation())


def _pods() -> list[dict[str, Any]]:
    return [
        pod_manifest("one", gpus=1),
        pod_manifest("two", gpus=2),
        pod_manifest("four", gpus=4),
        pod_manifest("share", units=25, memory=8192),
        pod_manifest("spread", gpus=2, policy="spread"),
        pod_manifest("typo", gpus=1, policy="no-such-policy"),
        pod_manifest("cpu-only"),
        pod_manifest("other", gpus=1, scheduler="default-scheduler"),
    ]


@pytest.mark.parametrize("decide_node", [True, False])
def test_warm_replies_equal_replies_decided_from_scratch_byte_for_byte(decide_node: bool) -> None:
    """On a mixed fleet, through binds between calls, the verbs server's filter and prioritize
    bytes equal a new service's plain answers encoded, and the decided node is `choose_node`'s."""
    config = ExtenderConfig(decide_node=decide_node)
    cluster = _fleet(config)
    warm = _service(config, cluster)
    routes = verb_routes(warm)
    names = [f"node-{i:03d}" for i in range(30)] + ["not-a-node"]
    rng = random.Random(11)
    checked = 0
    for step in range(24):
        for pod in _pods():
            asked = names if step % 3 else rng.sample(names, 12)
            body = {"Pod": pod, "Nodes": None, "NodeNames": asked}
            raw = json.dumps(body).encode()
            fresh = _service(config, cluster)
            plain = fresh.filter(json.loads(raw))
            assert routes["/filter"](raw) == compact_json(plain)
            passed = plain["NodeNames"] or []
            prio_raw = json.dumps({**body, "NodeNames": passed}).encode()
            assert routes["/prioritize"](prio_raw) == compact_json(fresh.prioritize(json.loads(prio_raw)))
            outcome = warm.decisions_for("ml", pod["metadata"]["name"])
            filtered = outcome.filtered if outcome is not None else None
            if filtered is not None and filtered.narrowed_from is not None:
                parsed = outcome.request if outcome is not None else None
                assert parsed is not None and not isinstance(parsed, str)
                snapshot = fresh.store.snapshot()
                terms = [
                    t
                    for n in filtered.narrowed_from.passed
                    if (t := _reference_terms(snapshot, n, parsed)) is not None
                ]
                chosen = choose_node(terms)
                assert chosen is not None and filtered.passed == (chosen.node,)
                checked += 1
        node = names[rng.randrange(30)]
        _bind(cluster, warm, node, rng.choice((WholeGpus(1), WholeGpus(2), GpuShare(25, 8192))), f"s{step}")
        if passed:
            _bind(cluster, warm, passed[0], WholeGpus(1), f"p{step}")
    assert checked > 0 or not decide_node


def test_bad_bodies_get_the_same_bytes_from_the_fast_path_as_from_the_plain_one(
    service: ExtenderService,
) -> None:
    """Not JSON, not an object, no node names, names that are not strings: the same error replies."""
    for raw in (b"{", b"[]", b'{"Pod": {}}', b'{"Pod": {"metadata": {}}, "NodeNames": [1]}', b"null"):
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        assert service.filter_json(raw) == compact_json(service.filter(body))


def test_filter_reply_parts_encode_exactly_as_json_dumps() -> None:
    """Entries with quotes, backslashes and non-ASCII names, and empty maps."""
    failed = {'a"b': "x\\y", "ñode": "needs 2 GPUs, 1 free", "plain": "é"}
    args = parse_extender_args({"Pod": {}, "NodeNames": ["keep", "ñ"]})
    expected = compact_json(filter_result(args, ["keep", "ñ"], failed, {"u": "v"}))
    parts = string_map_entries(failed), string_map_entries({"u": "v"})
    assert filter_result_json(["keep", "ñ"], *parts) == expected
    empty = compact_json(filter_result(args, [], {}, {}))
    assert filter_result_json([], string_map_entries({}), "") == empty


def test_reuse_finds_values_by_identity_and_forgets_the_least_recently_used() -> None:
    """Equal but distinct sources are different entries; the oldest unused entry goes first."""
    reuse: Reuse[str] = Reuse(2)
    a, b, c = {"k": 1}, {"k": 1}, {"k": 2}
    reuse.put(a, "a")
    reuse.put(b, "b")
    assert reuse.get(a) == "a" and reuse.get(b) == "b"
    reuse.get(a)  # a is now the most recently used
    reuse.put(c, "c")
    assert reuse.get(b) is None and reuse.get(a) == "a" and reuse.get(c) == "c"


def test_an_unchanged_cluster_hands_out_the_same_filter_outcome_and_bytes() -> None:
    """Asked twice with nothing changed in between, filter reuses its outcome and its encoding."""
    config = ExtenderConfig()
    cluster = _fleet(config, nodes=10)
    service = _service(config, cluster)
    raw = json.dumps(
        {"Pod": pod_manifest("again", gpus=2), "NodeNames": [f"node-{i:03d}" for i in range(10)]}
    )
    first = service.filter_json(raw.encode())
    log = service.decisions_for("ml", "again")
    outcome = log.filtered if log is not None else None
    again = service.filter_json(raw.encode())
    assert again is first
    log = service.decisions_for("ml", "again")
    assert outcome is not None and log is not None and log.filtered is outcome


def _terms(node: str, frag: float, link: float) -> Any:
    from topology.scoring import RawTerms

    return RawTerms(node, (link, 0.0, 0.0), frag, 0.5, None, link_relative=link > 0)  # type: ignore[arg-type]


def test_the_remembered_choice_follows_choose_node_as_nodes_change_and_the_best_link_moves() -> None:
    """Random changes to terms, passing nodes and the best ring bottleneck (gained, lost, shared):
    after each, the memo picks what `choose_node` picks over all passing nodes' terms."""
    from extender.placing.filter_outcome import FilterOutcome
    from extender.placing.node_choice_memo import ChoiceMemo

    rng = random.Random(5)
    names = [f"n{i}" for i in range(40)]
    terms = {n: _terms(n, rng.choice((0.0, 90.0, 200.0)), rng.choice((0.0, 50.0, 100.0))) for n in names}
    passing = set(rng.sample(names, 25))
    memo = ChoiceMemo()
    changed: frozenset[str] | None = None
    for step in range(300):
        outcome = FilterOutcome(tuple(n for n in names if n in passing))
        answer = memo.decide(outcome, step, changed, terms.__getitem__, passing.__contains__)
        expected = choose_node([terms[n] for n in outcome.passed])
        assert expected is not None and answer.passed == (expected.node,)
        moved = rng.sample(names, rng.randint(0, 3))
        for n in moved:
            roll = rng.random()
            if roll < 0.3:
                passing ^= {n}
            elif roll < 0.4:
                terms[n] = _terms(n, 0.0, 100.0 + rng.choice((0.0, 25.0)))  # a new best bottleneck
            else:
                terms[n] = _terms(n, rng.choice((0.0, 90.0, 200.0)), rng.choice((0.0, 50.0, 100.0)))
        if len(passing) < 2:
            passing |= set(names[:2])
            moved += names[:2]
        changed = frozenset(moved)


@pytest.mark.parametrize("decide_node", [True, False])
def test_lists_in_any_order_and_lists_that_move_by_a_few_names_get_the_from_scratch_answer(
    decide_node: bool,
) -> None:
    """kube-scheduler names the same nodes in a new order on every call (its filter fills the
    list as goroutines finish) and drops nodes its own filters find full: each call, shuffled and
    with a few names dropped or added, answers what a new service answers, in name order."""
    config = ExtenderConfig(decide_node=decide_node)
    cluster = _fleet(config, nodes=40)
    warm = _service(config, cluster)
    routes = verb_routes(warm)
    every = [f"node-{i:03d}" for i in range(40)]
    asked = list(every)
    rng = random.Random(23)
    for step in range(60):
        rng.shuffle(asked)
        if step % 4 == 3:  # the list moves: a few names leave, a few come back
            asked = asked[rng.randint(1, 3) :]
            asked += [n for n in rng.sample(every, 3) if n not in asked]
        for pod in _pods()[:5]:
            raw = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": asked}).encode()
            plain = _service(config, cluster).filter(json.loads(raw))
            reply = routes["/filter"](raw)
            assert reply == compact_json(plain)
            passed = json.loads(reply)["NodeNames"] or []
            assert passed == sorted(passed)
        _bind(cluster, warm, rng.choice(every), rng.choice((WholeGpus(1), GpuShare(25, 8192))), f"m{step}")


def test_the_same_names_in_another_order_reuse_the_answer_without_placing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked again with the names shuffled and nothing changed: the same outcome object, and
    no node is placed again; with two names added, only those two are placed."""
    import extender.placing.decisions as decisions

    config = ExtenderConfig()
    cluster = _fleet(config, nodes=30)
    service = _service(config, cluster)
    names = [f"node-{i:03d}" for i in range(28)]
    body = {"Pod": pod_manifest("again", gpus=1)}
    first = service.filter({**body, "NodeNames": names})
    log = service.decisions_for("ml", "again")
    outcome = log.filtered if log is not None else None
    placed: list[str] = []
    real_place = decisions.place
    monkeypatch.setattr(
        decisions, "place", lambda state, *a: placed.append(state.name) or real_place(state, *a)
    )
    shuffled = list(reversed(names))
    again = service.filter({**body, "NodeNames": shuffled})
    log = service.decisions_for("ml", "again")
    assert again == first and placed == []
    assert log is not None and log.filtered is outcome
    service.filter({**body, "NodeNames": [*shuffled, "node-028", "node-029"]})
    assert sorted(placed) == ["node-028", "node-029"]
