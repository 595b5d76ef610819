"""Summaries over seeds, the "## Cluster packing" section of docs/BENCHMARKS.md, and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.cluster.frag_table import FloatArray
from bench.cluster.protocol import RunRecord, fragmentation_rate_curve, unallocated_curve
from bench.cluster.registry import LABELS
from bench.cluster.trace import PaperResult

SECTION_TITLE = "## Cluster packing"
PLOT_RANGE = (50, 130)
ZOOM_RANGE = (85, 130)


@dataclass(frozen=True, slots=True)
class Stat:
    mean: float
    sd: float

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.sd:.2f}"


@dataclass(frozen=True, slots=True)
class PolicySummary:
    trace: str
    policy: str
    seeds: tuple[int, ...]
    unallocated: FloatArray  # (seeds, 131): unallocated % per arrival percent
    fragmentation_rate: FloatArray  # (seeds, 131)
    seconds: tuple[float, ...]
    failed: tuple[int, ...]
    multi_gpu_pods: int = 0
    multi_gpu_on_best: int = 0
    multi_gpu_gbps: float = 0.0

    def link_text(self) -> str:
        """Share of placed multi-GPU pods on their node's best ring, and their mean ring GB/s."""
        if not self.multi_gpu_pods:
            return "-"
        best = 100.0 * self.multi_gpu_on_best / self.multi_gpu_pods
        return f"{best:.0f}% / {self.multi_gpu_gbps / self.multi_gpu_pods:.0f}"

    def at(self, arrival: int) -> Stat:
        return _stat(self.unallocated[:, arrival])

    def frag_rate_at(self, arrival: int) -> Stat:
        return _stat(self.fragmentation_rate[:, arrival])


def _stat(values: FloatArray) -> Stat:
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return Stat(float(np.mean(values)), sd)


def summarise(records: Sequence[RunRecord]) -> PolicySummary:
    ordered = sorted(records, key=lambda r: r.seed)
    return PolicySummary(
        trace=ordered[0].trace,
        policy=ordered[0].policy,
        seeds=tuple(r.seed for r in ordered),
        unallocated=np.array([unallocated_curve(r) for r in ordered]),
        fragmentation_rate=np.array([fragmentation_rate_curve(r) for r in ordered]),
        seconds=tuple(r.seconds for r in ordered),
        failed=tuple(r.failed for r in ordered),
        multi_gpu_pods=sum(r.multi_gpu_pods for r in ordered),
        multi_gpu_on_best=sum(r.multi_gpu_on_best for r in ordered),
        multi_gpu_gbps=sum(r.multi_gpu_gbps for r in ordered),
    )


def verdict(ours: Stat, paper: PaperResult | None) -> str:
    """How our mean compares with the paper's, in units of the larger of the two sds."""
    if paper is None:
        return "-"
    spread = max(paper.sd, ours.sd, 0.05)
    gap = (ours.mean - paper.mean) / spread
    mark = "ok" if abs(gap) <= 1.0 else ("~" if abs(gap) <= 2.0 else "off")
    return f"{ours.mean - paper.mean:+.2f} ({gap:+.1f} sd, {mark})"


def trace_table(summaries: Sequence[PolicySummary], paper: dict[tuple[str, str, int], PaperResult]) -> str:
    lines = [
        "| policy | unallocated % at 100% (ours) | paper | difference | at 130% (ours) | paper at 130% "
        "| frag rate % at 90% (paper) | failed pods | multi-GPU pods on best ring / mean GB/s "
        "| CPU s / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        at100 = s.at(100)
        paper100 = paper.get((s.trace, s.policy, 100))
        paper130 = paper.get((s.trace, s.policy, 130))
        lines.append(
            f"| {LABELS.get(s.policy, s.policy)} | {at100} | "
            f"{_paper_text(paper100)} | {verdict(at100, paper100)} | {s.at(130)} | {_paper_text(paper130)} | "
            f"{s.frag_rate_at(90).mean:.1f} ({_paper_frag(paper100)}) | {np.mean(s.failed):.0f} | "
            f"{s.link_text()} | {np.mean(s.seconds):.1f} |"
        )
    return "\n".join(lines)


def _paper_frag(result: PaperResult | None) -> str:
    return "-" if result is None or result.frag_rate_at_90 is None else f"{result.frag_rate_at_90:.1f}"


def _paper_text(result: PaperResult | None) -> str:
    return "-" if result is None else f"{result.mean:.2f} ± {result.sd:.2f}"


def markdown_section(
    by_trace: dict[str, list[PolicySummary]],
    paper: dict[tuple[str, str, int], PaperResult],
    plot: str | None,
    notes: Sequence[str],
) -> str:
    parts = [
        SECTION_TITLE,
        "",
        "Written by `make bench-cluster` (`python -m bench.cluster`); do not edit by hand.",
        "",
        "Protocol of the FGD paper (Weng et al., ATC'23; `shared/reference/fgd.md` §2.5, §4) on the "
        "openb trace: 1213 GPU nodes / 6212 GPUs; per seed the pod list is shuffled and inflated by "
        "Monte-Carlo resampling to 130% of GPU capacity; pods are scheduled one at a time through the "
        "same filter (CPU, memory, GPU model, GPU share fit), failures are dropped; allocation is "
        "recorded after every pod. Metric: % of cluster GPU capacity unallocated when the cumulative "
        'arrived GPU requests reach 100% of capacity, mean ± sd over seeds. "paper" is the paper '
        "simulator's own 10-seed result; per-seed runs are not comparable one to one (different "
        "random streams), so agreement is judged in sds.",
        "",
    ]
    for trace, summaries in by_trace.items():
        seeds = summaries[0].seeds
        parts += [f"### Trace `{trace}` (seeds {_seed_text(seeds)})", "", trace_table(summaries, paper), ""]
    if plot:
        parts += [f"![unallocated GPU vs arrived workload, default trace]({plot})", ""]
    parts += [f"- {note}" for note in notes]
    return "\n".join(parts).rstrip() + "\n"


def _seed_text(seeds: Sequence[int]) -> str:
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(str(s) for s in seeds)


def replace_section(document: str, section: str) -> str:
    """`document` with its "## Cluster packing" section replaced by `section` (appended if absent)."""
    lines = document.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION_TITLE), None)
    if start is None:
        base = document if document.strip() else "# Benchmarks\n"
        return base.rstrip("\n") + "\n\n" + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")


def write_section(path: Path, section: str) -> None:
    existing = path.read_text() if path.exists() else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(existing, section))


def write_plot(summaries: Sequence[PolicySummary], path: Path, trace: str) -> None:
    """Unallocated % against arrived workload: 50..130% of capacity, and a zoom on 85..130%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110)
    for axes, (lo, hi) in zip(panels, (PLOT_RANGE, ZOOM_RANGE), strict=True):
        x = np.arange(lo, hi + 1)
        for s in summaries:
            curves = s.unallocated[:, lo : hi + 1]
            mean = np.nanmean(curves, axis=0)
            sd = np.nanstd(curves, axis=0, ddof=1) if len(curves) > 1 else np.zeros_like(mean)
            (line,) = axes.plot(x, mean, label=LABELS.get(s.policy, s.policy), linewidth=1.6)
            axes.fill_between(x, mean - sd, mean + sd, color=line.get_color(), alpha=0.15, linewidth=0)
        axes.axvline(100, color="grey", linestyle=":", linewidth=1)
        axes.set_xlabel("arrived workload (% of cluster GPU capacity)")
        axes.set_xlim(lo, hi)
        axes.set_ylim(0, None)
        axes.grid(True, alpha=0.3)
    panels[0].set_ylabel("unallocated GPU (% of capacity)")
    panels[0].set_title(f"openb {trace} trace, {len(summaries[0].seeds)} seeds (mean, band = sd)")
    panels[1].set_title("zoom: the cluster fills up")
    panels[1].legend(ncol=2, fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
