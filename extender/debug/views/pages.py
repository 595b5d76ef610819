"""Self-contained HTML pages of the debug views: the cluster overview and one node's page.

Nothing is fetched by the browser: no scripts, fonts or style sheets from elsewhere (GPU
machines often have no internet). The style sheet is inline (`templates/base.html`) and the
drawings are inline SVG from `extender.debug.views.svg`.

The pages are rendered from the Jinja2 templates in `templates/`, with autoescaping on: every
text taken from the cluster (node, pod and device names, reasons, warnings) is escaped by the
template. Only the SVG, escaped where it is built, comes in as `markupsafe.Markup`. This module
turns a `TrackedNode` into the few plain values the templates show; the markup is theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import networkx as nx
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from extender.debug.views.node_documents import node_summary
from extender.debug.views.occupants import NO_TOPOLOGY_MESSAGE, Occupant, occupants_by_gpu
from extender.debug.views.palette import (
    KIND_COLOURS,
    KIND_MEANING,
    STATUS_COLOURS,
    STATUS_MEANING,
    gib,
    link_label,
)
from extender.debug.views.svg import gpu_squares, node_svg
from extender.state.snapshot import TrackedNode
from topology.gpu_status import GPU_STATUSES, gpu_status, model_of
from topology.graph import build_graph
from topology.model import LinkKind, Nic
from topology.scheduling import NodeState


@dataclass(frozen=True, slots=True)
class LegendEntry:
    """One line of the legend: a GPU state or link kind, its colour, and what it means."""

    word: str
    colour: str
    meaning: str
    line: str = "solid"  # the border style drawn for a link kind


@dataclass(frozen=True, slots=True)
class Legend:
    statuses: tuple[LegendEntry, ...]
    kinds: tuple[LegendEntry, ...]


LEGEND = Legend(
    statuses=tuple(LegendEntry(s, STATUS_COLOURS[s], STATUS_MEANING[s]) for s in GPU_STATUSES),
    kinds=tuple(
        LegendEntry(k.value, KIND_COLOURS[k], KIND_MEANING[k], "dashed" if k is LinkKind.SYS else "solid")
        for k in LinkKind
    ),
)


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One row of the node page's GPU table."""

    index: int
    status: str
    colour: str
    uuid: str
    numa: str
    free_mib: int
    memory_mib: int
    free_units: int
    units_per_gpu: int
    holders: Sequence[Occupant]


@dataclass(frozen=True, slots=True)
class MatrixCell:
    """One cell of the link matrix: the diagonal, a pair with no known link, or a link."""

    kind: Literal["self", "unknown", "link"]
    label: str = ""
    colour: str = ""
    bandwidth: float = 0.0


@dataclass(frozen=True, slots=True)
class MatrixRow:
    label: str
    cells: tuple[MatrixCell, ...]


@dataclass(frozen=True, slots=True)
class Matrix:
    """The node's link matrix, GPUs by GPUs and NICs (like `nvidia-smi topo -m`)."""

    headers: tuple[str, ...]
    rows: tuple[MatrixRow, ...]
    nics: tuple[Nic, ...]


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One node of the overview: its `node_summary` and its GPUs as coloured squares."""

    summary: dict[str, Any]
    squares: Markup


def _general(value: float) -> str:
    """A number as Python's `g` format writes it (12.5, 450, 0)."""
    return format(value, "g")


_ENV = Environment(
    loader=PackageLoader("extender.debug.views", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["gib"] = gib
_ENV.filters["g"] = _general
_ENV.globals["legend_entries"] = LEGEND


def index_page(snaps: Sequence[TrackedNode]) -> str:
    """GET /debug/topology as HTML: one row per node, GPUs as coloured squares."""
    nodes = [IndexRow(node_summary(s), gpu_squares(s.state)) for s in snaps]
    return _ENV.get_template("index.html").render(title="Linkpack: GPU nodes", nodes=nodes)


def node_page(snap: TrackedNode) -> str:
    """GET /debug/topology/{node} as HTML."""
    template = _ENV.get_template("node.html")
    title = f"Linkpack: {snap.name}"
    state = snap.state
    if state is None:
        return template.render(title=title, name=snap.name, no_topology=NO_TOPOLOGY_MESSAGE)
    summary = node_summary(snap)
    return template.render(
        title=title,
        name=snap.name,
        no_topology="",
        summary=summary,
        gpu_count=state.topology.gpu_count,
        model=model_of(state),
        nvswitch=state.topology.nvswitch,
        counts=", ".join(f"{summary[s]} {s}" for s in GPU_STATUSES if summary[s]),
        problems=snap.overcommits,
        svg=node_svg(snap),
        gpus=_gpu_rows(state, occupants_by_gpu(snap.ledger)),
        pods=snap.ledger.entries,
        matrix=_matrix(state),
        warnings=state.topology.warnings,
    )


def _gpu_rows(state: NodeState, held: dict[int, list[Occupant]]) -> list[GpuRow]:
    rows = []
    for i, gpu in enumerate(state.topology.gpus):
        usage = state.usage[i]
        status = gpu_status(usage)
        rows.append(
            GpuRow(
                index=i,
                status=status,
                colour=STATUS_COLOURS[status],
                uuid=gpu.uuid,
                numa=str(gpu.numa_node if gpu.numa_node is not None else "?"),
                free_mib=state.free_memory_mib(i) if usage.usable else 0,
                memory_mib=gpu.memory_mib,
                free_units=state.free_units(i) if usage.usable else 0,
                units_per_gpu=state.units_per_gpu,
                holders=held.get(i, ()),
            )
        )
    return rows


def _matrix(state: NodeState) -> Matrix:
    graph = build_graph(state.topology)
    gpus = [g.index for g in state.topology.gpus]
    nics = [n.index for n in state.topology.nics]
    rows = []
    for i in gpus:
        cells = [MatrixCell("self") if i == j else _cell(graph, f"gpu{i}", f"gpu{j}") for j in gpus]
        cells.extend(_cell(graph, f"gpu{i}", f"nic{k}") for k in nics)
        rows.append(MatrixRow(f"GPU{i}", tuple(cells)))
    headers = ("", *(f"GPU{i}" for i in gpus), *(f"NIC{k}" for k in nics))
    return Matrix(headers, tuple(rows), state.topology.nics)


def _cell(graph: nx.Graph, a: str, b: str) -> MatrixCell:
    if not graph.has_edge(a, b):
        return MatrixCell("unknown")
    d = graph.edges[a, b]
    kind: LinkKind = d["kind"]
    return MatrixCell("link", link_label(kind, int(d["nvlinks"])), KIND_COLOURS[kind], float(d["bandwidth"]))
