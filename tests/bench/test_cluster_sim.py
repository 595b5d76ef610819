"""The cluster packing simulator: loader, protocol, cached FGD measure, baselines, determinism."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.cluster import baselines
from bench.cluster.__main__ import parse_seeds
from bench.cluster.cluster import Decision, SimulatedCluster
from bench.cluster.fgd_policy import FgdPolicy, fgd_policy
from bench.cluster.policy import NodeChoice, NodeSnapshot, PolicyFactory, RunContext, per_node
from bench.cluster.protocol import RunRecord, build_arrivals, unallocated_curve
from bench.cluster.registry import ALL_POLICIES, parse_policies
from bench.cluster.report import SECTION_TITLE, replace_section
from bench.cluster.simulate import RunSpec, schedule, simulate
from bench.cluster.topologies import topology_for, wiring_name
from bench.cluster.trace import (
    NODE_FILE,
    TraceNode,
    TracePod,
    load_nodes,
    load_pods,
    openb_dir,
    paper_workload,
    pod_file,
)
from topology.fragmentation import TypicalRequest, Workload, node_fragmentation
from topology.model import LinkKind

needs_trace = pytest.mark.skipif(
    not (openb_dir() / NODE_FILE).exists(), reason="openb trace not found under $LINKPACK_SHARED"
)


def _node(name: str, gpus: int, cpu: int = 64_000, model: str = "T4") -> TraceNode:
    return TraceNode(name, cpu, 256_000, gpus, model)


def _pod(name: str, milli: int, count: int = 1, cpu: int = 1000, models: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name, cpu, 1000, count if milli else 0, milli, models)


def _workload(*shapes: tuple[int, int, float]) -> Workload:
    return tuple(TypicalRequest(milli, count, 0, 0, p) for milli, count, p in shapes)


def _context(cluster: SimulatedCluster, seed: int = 0, workload: Workload = ()) -> RunContext:
    return RunContext(cluster, np.arange(cluster.size, dtype=np.int64), np.random.default_rng(seed), workload)


def _set_free(
    cluster: SimulatedCluster, node: int, free: tuple[int, ...], cpu_left: int | None = None
) -> None:
    """Force a node's free GPU milli (and CPU) for a hand-made case, keeping the caches coherent."""
    cluster.gpu_left[node, : len(free)] = free
    if cpu_left is not None:
        cluster.cpu_left[node] = cpu_left
    row = cluster.gpu_left[node]
    cluster.gpu_left_total[node] = row.sum()
    cluster.fully_free[node] = (row == 1000).sum()
    cluster.largest_free[node] = row.max()
    cluster.frag.refresh(node, row, int(cluster.cpu_left[node]))
    cluster.version[node] += 1


# ----------------------------------------------------------------------------- loader and protocol


@needs_trace
def test_loader_parses_the_openb_cluster_and_pod_lists() -> None:
    nodes = load_nodes(openb_dir() / NODE_FILE)
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    pods = load_pods(pod_file("default"))
    assert len(pods) == 8152
    assert sum(p.gpu_total_milli for p in pods) == 6_086_800  # 98.0% of capacity (fgd.md §1.3)
    assert sum(p.is_fractional for p in pods) == 3078
    assert len(paper_workload(pods)) == 35  # the paper's typical-pod rule keeps 35 shapes
    multigpu = load_pods(pod_file("multigpu20"))  # no gpu_spec or time columns in that file
    assert len(multigpu) == 8324
    assert all(p.gpu_models == () for p in multigpu)


@needs_trace
def test_empty_cluster_fragmentation_matches_the_paper_simulator() -> None:
    nodes = load_nodes(openb_dir() / NODE_FILE)
    cluster = SimulatedCluster(nodes, paper_workload(load_pods(pod_file("default"))))
    assert 100 * cluster.fragmentation_milli / cluster.total_gpu_milli == pytest.approx(13.94, abs=0.01)


def test_arrivals_shuffle_the_trace_then_inflate_to_130_percent() -> None:
    pods = tuple(_pod(f"p{i:03d}", 500 if i % 3 else 1000) for i in range(90))
    capacity = 100_000
    arrivals = build_arrivals(pods, node_count=7, capacity_milli=capacity, seed=42)
    head = arrivals.pod_order[: len(pods)]
    assert sorted(head) == list(range(len(pods)))
    assert head != tuple(range(len(pods)))
    total = sum(pods[i].gpu_total_milli for i in arrivals.pod_order)
    assert 1.3 * capacity - 1000 < total <= 1.3 * capacity
    assert sorted(arrivals.node_priority.tolist()) == list(range(7))


def test_arrivals_trim_a_trace_that_asks_for_more_than_130_percent() -> None:
    pods = tuple(_pod(f"p{i:03d}", 1000) for i in range(200))
    arrivals = build_arrivals(pods, node_count=3, capacity_milli=100_000, seed=7)
    assert sum(pods[i].gpu_total_milli for i in arrivals.pod_order) == 130_000


def test_the_metric_reads_allocation_when_arrivals_reach_100_percent() -> None:
    arrived = np.array([50, 99, 100, 101, 120, 130]) * 10
    allocated = np.array([50, 95, 95, 96, 96, 96]) * 10
    record = RunRecord("t", "p", 1, 1000, arrived, allocated, np.zeros(6), np.ones(6, bool), 0.0)
    curve = unallocated_curve(record)
    assert curve[100] == pytest.approx(5.0)
    assert curve[130] == pytest.approx(4.0)
    assert curve[121] == pytest.approx(4.0)  # empty bucket: neighbours within 1 point


# ----------------------------------------------------------------------------- cached measure


def test_frag_table_agrees_with_the_reference_measure_before_and_after_placements() -> None:
    rng = random.Random(3)
    workload = (
        TypicalRequest(500, 1, 4000, 0, 0.3),
        TypicalRequest(250, 1, 2000, 0, 0.2),
        TypicalRequest(1000, 2, 8000, 0, 0.2),
        TypicalRequest(1000, 1, 6000, 0, 0.1, ("A10",)),
        TypicalRequest(0, 0, 3000, 0, 0.2),
    )
    nodes = tuple(_node(f"n{i}", g, model=m) for i, (g, m) in enumerate([(8, "T4"), (4, "A10"), (2, "T4")]))
    cluster = SimulatedCluster(nodes, workload)
    for _ in range(40):
        node = rng.randrange(3)
        count = nodes[node].gpu_count
        free = tuple(rng.choice([0, 100, 250, 400, 500, 750, 1000]) for _ in range(count))
        _set_free(cluster, node, free, cpu_left=rng.choice([0, 2500, 5000, 64_000]))
        model, cpu = nodes[node].model, int(cluster.cpu_left[node])
        assert cluster.frag.values[node] == pytest.approx(
            node_fragmentation(free, cpu, None, model, workload)
        )
        share = _pod("s", 200, cpu=1000)
        for device in range(count):
            if free[device] < 200:
                continue
            after = list(free)
            after[device] -= 200
            got = cluster.fragmentation_after(np.array([node]), share, np.array([free[device]]))[0]
            assert got == pytest.approx(node_fragmentation(tuple(after), cpu - 1000, None, model, workload))
        if free.count(1000) >= 2:
            after = list(free)
            for _ in range(2):
                after[after.index(1000)] = 0
            got = cluster.fragmentation_after(np.array([node]), _pod("w", 1000, 2, cpu=1000), None)[0]
            assert got == pytest.approx(node_fragmentation(tuple(after), cpu - 1000, None, model, workload))


# ----------------------------------------------------------------------------- baselines, hand-made


def _two_node_cluster() -> SimulatedCluster:
    return SimulatedCluster((_node("a", 4), _node("b", 8)), ())


def test_packing_scores_match_the_paper_simulator_unit_tests() -> None:
    cluster = _two_node_cluster()
    feasible = np.array([0, 1])
    share = _pod("s", 300)
    assert baselines.packing_scores(cluster, share, feasible).tolist() == [29, 25]  # all-free nodes
    _set_free(cluster, 0, (700, 1000, 1000, 1000))
    _set_free(cluster, 1, (1000,) * 7 + (0,))
    assert baselines.packing_scores(cluster, share, feasible).tolist() == [93, 49]  # used GPU; free GPU
    assert baselines.packing_scores(cluster, _pod("w", 1000, 2), feasible).tolist() == [48, 48]
    assert baselines.packing_scores(cluster, _pod("c", 0), feasible).tolist() == [0, 0]


def test_bestfit_and_dotprod_scores_by_hand() -> None:
    cluster = SimulatedCluster((_node("a", 2, cpu=64_000),), ())
    pod = TracePod("p", 16_000, 0, 1, 1000)
    feasible = np.array([0])
    # raw = 0.5*48000/128000 + 0.5*1000/8000 = 0.25
    assert baselines.bestfit_scores(cluster, pod, feasible).tolist() == [75]
    # dot = 0.5*0.125 + 0.25*0.125 = 0.09375; 100*(1 - dot/2) = 95.3
    assert baselines.dotprod_scores(cluster, pod, feasible).tolist() == [95]


def test_clustering_prefers_nodes_holding_only_the_same_kind_of_pod() -> None:
    nodes = tuple(_node(n, 8) for n in "abcd")
    cluster = SimulatedCluster(nodes, ())
    cluster.assign(_pod("s1", 500), Decision(0, (0,)))  # a: shares only
    cluster.assign(_pod("s2", 500), Decision(1, (0,)))  # b: shares and a whole GPU
    cluster.assign(_pod("w1", 1000), Decision(1, (1,)))
    cluster.assign(_pod("w2", 1000), Decision(2, (0,)))  # c: whole GPUs only; d: empty
    scores = baselines.clustering_scores(cluster, _pod("s3", 250), np.arange(4)).tolist()
    base = [(25 * (8000 - t)) // 8000 for t in (7500, 6500, 7000, 8000)]
    assert scores == [base[0] + 75, base[1] + 50, base[2], base[3] + 25]


def test_fgd_follows_the_paper_running_example() -> None:
    """Free <0.5, 1.0>, M = {0.3, 0.5, 0.7} equally likely: 0.3 goes to GPU B, then 0.5 to GPU A."""
    workload = _workload((300, 1, 1 / 3), (500, 1, 1 / 3), (700, 1, 1 / 3))
    cluster = SimulatedCluster((_node("n", 2),), workload)
    _set_free(cluster, 0, (500, 1000))
    policy = FgdPolicy(_context(cluster, workload=workload), faithful=False)
    first = policy.decide(cluster, _pod("a", 300), np.array([0]))
    assert first == Decision(0, (1,))
    cluster.assign(_pod("a", 300), first)
    assert policy.decide(cluster, _pod("b", 500), np.array([0])) == Decision(0, (0,))


def test_fgd_packs_shares_so_that_whole_gpus_stay_free() -> None:
    """Two 2-GPU nodes, two half shares then three 1-GPU pods: only packing the shares fits them all."""
    workload = _workload((500, 1, 0.5), (1000, 1, 0.5))
    arrivals = [_pod("s1", 500), _pod("s2", 500), _pod("w1", 1000), _pod("w2", 1000), _pod("w3", 1000)]
    cluster = SimulatedCluster((_node("a", 2), _node("b", 2)), workload)
    trajectory = schedule(cluster, arrivals, fgd_policy(_context(cluster, workload=workload)))
    assert trajectory.placed.all()
    assert sorted(cluster.gpu_left[:, :2].ravel().tolist()) == [0, 0, 0, 0]


def test_random_policy_is_reproducible_by_seed() -> None:
    cluster = SimulatedCluster(tuple(_node(f"n{i}", 8) for i in range(20)), ())
    pod = _pod("s", 300)

    def picks(seed: int) -> list[Decision | None]:
        policy = baselines.random_policy(_context(cluster, seed))
        return [policy.decide(cluster, pod, np.arange(20)) for _ in range(10)]

    assert picks(1) == picks(1)
    assert picks(1) != picks(2)


def test_a_per_node_scorer_plugs_in_and_ties_go_to_node_priority() -> None:
    def most_cpu(node: NodeSnapshot, pod: TracePod) -> NodeChoice | None:
        if node.model != "T4":
            return None
        return NodeChoice(score=node.cpu_left // 10_000, gpus=(0,) if pod.gpu_count else ())

    factory: PolicyFactory = per_node(lambda context: most_cpu)
    nodes = (
        _node("a", 2, 32_000),
        _node("b", 2, 64_000),
        _node("c", 2, 64_000),
        _node("d", 2, 96_000, "A10"),
    )
    cluster = SimulatedCluster(nodes, ())
    context = RunContext(cluster, np.array([3, 2, 1, 0]), np.random.default_rng(0), ())
    assert factory(context).decide(cluster, _pod("p", 500), np.arange(4)) == Decision(2, (0,))


# ----------------------------------------------------------------------------- whole runs


@needs_trace
def test_runs_are_deterministic_by_seed() -> None:
    nodes = load_nodes(openb_dir() / NODE_FILE)
    pods = load_pods(pod_file("default"))
    workload = paper_workload(pods)

    def run(seed: int) -> RunRecord:
        return simulate(RunSpec("default", "fgd", seed), nodes, pods, workload, fgd_policy, pod_limit=400)

    first, again, other = run(42), run(42), run(43)
    assert np.array_equal(first.allocated_milli, again.allocated_milli)
    assert np.array_equal(first.fragmentation_milli, again.fragmentation_milli)
    assert not np.array_equal(first.arrived_milli, other.arrived_milli)


def test_ours_places_through_the_extender_functions_on_a_small_cluster() -> None:
    pytest.importorskip("topology.placement")
    from bench.cluster.ours import ours_factory

    workload = _workload((500, 1, 0.5), (1000, 1, 0.5))
    cluster = SimulatedCluster((_node("a", 8, model="G2"), _node("b", 2)), workload)
    arrivals = [_pod("s1", 500), _pod("s2", 500), _pod("w", 1000, 4), _pod("c", 0)]
    trajectory = schedule(cluster, arrivals, ours_factory()(_context(cluster, workload=workload)))
    assert trajectory.placed.all()
    assert int(cluster.gpu_left_total.sum()) == 10_000 - 5000


# ----------------------------------------------------------------------------- topologies, report


def test_topologies_follow_the_documented_mapping() -> None:
    assert wiring_name("V100M32", 8) == "hybrid-cube-mesh"
    assert wiring_name("G3", 8) == "nvswitch"
    assert wiring_name("T4", 2) == "pcie-two-socket"
    mesh = topology_for("G2", 8)
    bonds = [sum(lk.nvlinks for lk in mesh.gpu_links if g in (lk.a, lk.b)) for g in range(8)]
    assert bonds == [6] * 8  # every V100 uses its six NVLink bricks
    assert mesh.link(0, 5).kind is LinkKind.SYS
    assert topology_for("T4", 4).link(0, 1).kind is LinkKind.PIX
    assert len(topology_for("A10", 1).gpu_links) == 0


def test_report_replaces_only_its_own_section() -> None:
    document = (
        "# Benchmarks\n\n## Placement\n\nkept\n\n## Cluster packing\n\nold\n\n## Extender\n\nalso kept\n"
    )
    updated = replace_section(document, f"{SECTION_TITLE}\n\nnew\n")
    assert "old" not in updated
    assert updated.index("## Placement") < updated.index("new") < updated.index("## Extender")
    assert "kept" in updated and "also kept" in updated
    assert replace_section("", f"{SECTION_TITLE}\n\nnew\n").startswith("# Benchmarks\n\n## Cluster packing")


def test_cli_parses_seed_ranges_and_policy_lists() -> None:
    assert parse_seeds("42-51") == tuple(range(42, 52))
    assert parse_seeds("42,45-46") == (42, 45, 46)
    assert parse_policies("all") == ALL_POLICIES
    assert parse_policies("fgd,all,fgd-ideal")[0] == "fgd"
    assert parse_policies("all,fgd-ideal")[-1] == "fgd-ideal"
    with pytest.raises(ValueError, match="unknown"):
        parse_policies("tetris")


def test_the_link_audit_counts_multi_gpu_pods_on_their_nodes_best_ring() -> None:
    from bench.cluster.simulate import LinkAudit

    cluster = SimulatedCluster((_node("a", 8, model="G2"),), ())
    audit = LinkAudit()
    audit.note(cluster, _pod("one", 1000), Decision(0, (0,)))
    audit.note(cluster, _pod("best", 1000, 2), Decision(0, (0, 3)))  # NV2 pair on the cube mesh
    audit.note(cluster, _pod("worse", 1000, 2), Decision(0, (0, 5)))  # 0-5 crosses sockets (SYS)
    assert (audit.pods, audit.on_best) == (2, 1)
    assert audit.gbps_total > 0


def test_ours_decides_as_the_extender_would_on_every_node_with_its_exact_cpu() -> None:
    """Each decision equals `place` + `node_terms` (exact free CPU/memory, CPU capacity, the
    learned workload) on every feasible node and `topology.node_choice.choose_node` over them:
    the node classes and CPU bands of the simulator change nothing."""
    from bench.cluster.ours import extender_default_policy, node_state, ours_factory, request_for
    from topology.node_choice import choose_node
    from topology.placement import place
    from topology.scheduling import Placement
    from topology.scoring import NodeResourcesContext, default_fragmentation, node_terms

    workload = (TypicalRequest(1000, 1, 8000, 0, 0.5), TypicalRequest(500, 1, 4000, 0, 0.5))
    nodes = tuple(
        _node(f"n{i}", g, cpu=c, model=m)
        for i, (g, c, m) in enumerate(
            [(8, 40_000, "G2"), (8, 96_000, "G2"), (2, 20_000, "T4"), (8, 64_000, "G3"), (8, 96_000, "G2")]
        )
    )
    cluster = SimulatedCluster(nodes, workload)
    context = _context(cluster, workload=workload)
    policy = ours_factory()(context)
    pods = [
        _pod(f"p{i}", milli, count, cpu)
        for i, (milli, count, cpu) in enumerate(
            [
                (1000, 1, 6000),
                (470, 1, 3000),
                (1000, 2, 12_000),
                (810, 1, 9000),
                (500, 1, 2000),
                (1000, 4, 30_000),
                (1000, 1, 7000),
                (250, 1, 5000),
                (0, 0, 4000),
                (320, 1, 11_000),
            ]
        )
    ]
    default = extender_default_policy()
    for pod in pods:
        policy.observe(pod)  # type: ignore[attr-defined]
        learned = policy.learner.workload  # type: ignore[attr-defined]
        feasible = cluster.feasible(pod)
        decision = policy.decide(cluster, pod, feasible)
        request = request_for(pod)
        if request is None:
            assert decision is not None and decision.gpus == ()
            cluster.assign(pod, decision)
            continue
        terms = []
        for node in feasible.tolist():
            count = int(cluster.gpu_count[node])
            usage = tuple(
                -1 if held else int(free)
                for free, held in zip(
                    cluster.gpu_left[node, :count], cluster.whole_held[node, :count], strict=True
                )
            )
            state = node_state(nodes[node].name, topology_for(nodes[node].model, count), usage)
            outcome = place(state, request, default, learned)
            if not isinstance(outcome, Placement):
                continue
            cpu, memory = int(cluster.cpu_left[node]), int(cluster.memory_left[node])
            resources = NodeResourcesContext(
                cpu,
                memory,
                cpu - pod.cpu_milli,
                memory - pod.memory_mib,
                learned,
                int(cluster.cpu_capacity[node]),
            )
            terms.append(node_terms(state, outcome, request, default, default_fragmentation(), resources))
        best = choose_node(terms)
        if best is None:
            assert decision is None
            continue
        assert decision is not None
        assert (nodes[decision.node].name, decision.gpus) == (best.node, best.placement.gpus)
        cluster.assign(pod, decision)
