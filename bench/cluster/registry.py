"""The policies the benchmark knows, by the names the CLI takes."""

from __future__ import annotations

from collections.abc import Callable

from bench.cluster import baselines, fgd_policy, ours
from bench.cluster.policy import PolicyFactory

#: name → a maker of a fresh factory (a factory may keep memos across the runs it builds).
POLICIES: dict[str, Callable[[], PolicyFactory]] = {
    "random": lambda: baselines.random_policy,
    "dotprod": lambda: baselines.dotprod_policy,
    "clustering": lambda: baselines.clustering_policy,
    "packing": lambda: baselines.packing_policy,
    "bestfit": lambda: baselines.bestfit_policy,
    "fgd": lambda: fgd_policy.fgd_policy,
    "fgd-ideal": lambda: fgd_policy.fgd_ideal_policy,
    "ours": ours.ours_factory,
    "ours-kube-cpu": lambda: ours.ours_factory(cpu_only="least"),
}

#: What `--policies all` runs: the paper's six baselines and ours (fgd-ideal is opt-in).
ALL_POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "ours")

LABELS = {
    "random": "Random",
    "dotprod": "DotProd",
    "clustering": "Clustering",
    "packing": "Packing",
    "bestfit": "BestFit",
    "fgd": "FGD",
    "fgd-ideal": "FGD (ideal argmin)",
    "ours": "ours",
    "ours-kube-cpu": "ours, CPU-only pods by kube-scheduler",
}


def parse_policies(text: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        for name in ALL_POLICIES if part == "all" else (part,) if part else ():
            if name not in names:
                names.append(name)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {sorted(POLICIES)}")
    return tuple(names)
