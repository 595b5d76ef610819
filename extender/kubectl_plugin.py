"""`kubectl linkpack`: Linkpack's view of the cluster's GPUs, from the API objects it keeps.

    kubectl linkpack nodes              GPUs per node: free, shared, whole, unhealthy, cordoned
    kubectl linkpack topo NODE          the node's link matrix (kinds and GB/s, like topo -m)
    kubectl linkpack pods [-n NS]       which pod holds which GPUs and shares
    kubectl linkpack explain [-n NS] POD   why the pod waits, or why it got its node and GPUs

It reads the GpuTopology objects (linkpack.io/v1alpha1, written by the node agents), the
per-node ledger ConfigMaps (the extender's committed allocations) and the pods' allocation
annotations; `explain` asks the extender's /debug/explain endpoint, through the API server's
service proxy unless `--extender-url` (or LINKPACK_EXTENDER_URL) names it directly.
Credentials: `--kubeconfig`, else $KUBECONFIG, else ~/.kube/config, else in-cluster.

Fetching (`KubeSource`) is kept apart from the pure translation and formatting below it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO
from urllib.parse import quote

import httpx
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from extender.debug_views import GPU_STATUSES, gpu_status, model_of
from extender.ledger import LEDGER_LABEL, Ledger, LedgerError
from extender.translate import ledger_from_config_map
from topology.accounting import node_state_from_grants
from topology.allocation import ALLOCATION_ANNOTATION, Allocation, AllocationError, decode_allocation
from topology.codec import CodecError, decode_topology
from topology.graph import build_graph, gpu_vertex, nic_vertex
from topology.model import LinkKind, NodeTopology
from topology.workload import DEFAULT_UNITS_PER_GPU, GpuGrant, NodeState

GROUP, VERSION, PLURAL = "linkpack.io", "v1alpha1", "gputopologies"
SYSTEM_NAMESPACE = "linkpack-system"
EXTENDER_SERVICE = "linkpack-extender:8888"
URL_ENV = "LINKPACK_EXTENDER_URL"
_TIMEOUT_S = 15.0

Doc = dict[str, Any]


class PluginError(Exception):
    """Something the user can act on (no such node, API unreachable); printed without a traceback."""


# ----------------------------------------------------------------------------- translation


@dataclass(frozen=True, slots=True)
class GpuHealthRow:
    index: int
    uuid: str
    healthy: bool
    reason: str
    cordoned: bool


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One GpuTopology object: the decoded topology (or why it could not be), health, heartbeat."""

    name: str
    topology: NodeTopology | None
    health: tuple[GpuHealthRow, ...] = ()
    heartbeat: dt.datetime | None = None
    error: str = ""

    @property
    def unhealthy(self) -> frozenset[int]:
        return frozenset(h.index for h in self.health if not h.healthy)

    @property
    def cordoned(self) -> frozenset[int]:
        return frozenset(h.index for h in self.health if h.cordoned)


def node_record(obj: Mapping[str, Any]) -> NodeRecord:
    """A GpuTopology object (as JSON) into a `NodeRecord`; a malformed spec is reported, not raised."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    status = obj.get("status") or {}
    health = tuple(
        GpuHealthRow(
            int(h["index"]),
            str(h.get("uuid") or ""),
            h.get("healthy") is not False,
            str(h.get("reason") or ""),
            bool(h.get("cordoned")),
        )
        for h in status.get("gpuHealth") or []
        if isinstance(h, Mapping) and isinstance(h.get("index"), int)
    )
    heartbeat = _parse_time(status.get("heartbeat"))
    try:
        topology = decode_topology(obj.get("spec") or {})
    except CodecError as exc:
        return NodeRecord(name, None, health, heartbeat, f"malformed spec: {exc}")
    return NodeRecord(name, topology, health, heartbeat)


def _parse_time(raw: object) -> dt.datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def ledgers_from(objs: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Ledger], dict[str, str]]:
    """Ledger ConfigMaps by node, and the ones that could not be read (node -> why)."""
    ledgers: dict[str, Ledger] = {}
    errors: dict[str, str] = {}
    for obj in objs:
        try:
            ledger = ledger_from_config_map(obj)
        except LedgerError as exc:
            errors[str((obj.get("metadata") or {}).get("name") or "?")] = str(exc)
            continue
        ledgers[ledger.node] = ledger
    return ledgers, errors


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """A pod carrying a `linkpack.io/allocation` annotation (`allocation` None: unreadable)."""

    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str
    allocation: Allocation | None
    error: str = ""


def pod_allocations(pods: Iterable[Mapping[str, Any]]) -> list[PodAllocation]:
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if raw is None:
            continue
        try:
            allocation: Allocation | None = decode_allocation(str(raw))
            error = ""
        except AllocationError as exc:
            allocation, error = None, str(exc)
        out.append(
            PodAllocation(
                str(meta.get("namespace") or "default"),
                str(meta.get("name") or ""),
                str(meta.get("uid") or ""),
                str((pod.get("spec") or {}).get("nodeName") or ""),
                str((pod.get("status") or {}).get("phase") or ""),
                allocation,
                error,
            )
        )
    return out


def node_state_of(record: NodeRecord, ledger: Ledger | None, units_per_gpu: int) -> NodeState | None:
    if record.topology is None:
        return None
    grants = ledger.grants() if ledger is not None else ()
    state, _ = node_state_from_grants(
        record.name, record.topology, grants, units_per_gpu, record.unhealthy, record.cordoned
    )
    return state


# ----------------------------------------------------------------------------- formatting


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns aligned like kubectl's: left-aligned, three spaces apart, no trailing blanks."""
    body = [list(headers), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in body) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body)


def age(then: dt.datetime | None, now: dt.datetime) -> str:
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}Gi"


def _health_text(record: NodeRecord) -> str:
    bad = [h for h in record.health if not h.healthy]
    if not bad:
        return "ok"
    return "; ".join(f"GPU{h.index}: {h.reason or 'unhealthy'}" for h in bad)


def format_nodes(
    records: Sequence[NodeRecord],
    ledgers: Mapping[str, Ledger],
    now: dt.datetime,
    units_per_gpu: int = DEFAULT_UNITS_PER_GPU,
    ledger_errors: Mapping[str, str] | None = None,
) -> str:
    """`kubectl linkpack nodes`: one line per GPU node."""
    headers = [
        "NODE",
        "MODEL",
        "GPUS",
        *(s.upper() for s in GPU_STATUSES),
        "FREE-MEM",
        "PODS",
        "HEARTBEAT",
        "HEALTH",
    ]
    rows = []
    named = {r.name for r in records}
    for record in sorted(records, key=lambda r: r.name):
        ledger = ledgers.get(record.name)
        pods = str(len(ledger.entries)) if ledger else "0"
        state = node_state_of(record, ledger, units_per_gpu)
        if state is None:
            blanks = ["-"] * (2 + len(GPU_STATUSES) + 1)
            rows.append([record.name, *blanks, pods, age(record.heartbeat, now), record.error])
            continue
        counts = {s: 0 for s in GPU_STATUSES}
        for usage in state.usage:
            counts[gpu_status(usage)] += 1
        free_memory = sum(state.free_memory_mib(i) for i, u in enumerate(state.usage) if u.usable)
        rows.append(
            [
                record.name,
                model_of(state) or "?",
                str(state.topology.gpu_count),
                *(str(counts[s]) for s in GPU_STATUSES),
                _gib(free_memory),
                pods,
                age(record.heartbeat, now),
                _health_text(record),
            ]
        )
    for node in sorted(set(ledgers) - named):
        blanks = ["-"] * (2 + len(GPU_STATUSES) + 1)
        rows.append([node, *blanks, str(len(ledgers[node].entries)), "-", "no GpuTopology (ledger only)"])
    text = table(headers, rows) if rows else "No GpuTopology objects found: is the node agent running?"
    for name, error in sorted((ledger_errors or {}).items()):
        text += f"\nwarning: ledger {name} is unreadable: {error}"
    return text


def _cell(kind: LinkKind, nvlinks: int, bandwidth: float) -> str:
    label = f"NV{nvlinks}" if kind is LinkKind.NV else kind.value
    return f"{label} {bandwidth:.3g}"


TOPO_LEGEND = """\
Legend (numbers are GB/s per direction, estimated from the GPU model and the link kind):
  X     = self
  NV#   = NVLink with # links, directly or through NVSwitch
  INTERNAL = same board (dual-GPU card)
  PIX   = one PCIe switch
  PXB   = several PCIe switches, no host bridge
  PHB   = a PCIe host bridge
  NODE  = host bridges within one NUMA node
  SYS   = across NUMA nodes (the socket interconnect)"""


def format_topo(record: NodeRecord) -> str:
    """`kubectl linkpack topo NODE`: the link matrix with Linkpack's kinds and bandwidth."""
    topology = record.topology
    if topology is None:
        return f"GpuTopology {record.name}: {record.error}"
    graph = build_graph(topology)
    gpus = [g.index for g in topology.gpus]
    nics = [n.index for n in topology.nics]
    names = [*(f"GPU{i}" for i in gpus), *(f"NIC{k}" for k in nics)]
    vertices = [*(gpu_vertex(i) for i in gpus), *(nic_vertex(k) for k in nics)]
    rows = []
    for name, vertex in zip(names, vertices, strict=True):
        cells = []
        for other in vertices:
            if other == vertex:
                cells.append("X")
            elif graph.has_edge(vertex, other) and graph.edges[vertex, other]["role"] == "direct":
                e = graph.edges[vertex, other]
                cells.append(_cell(e["kind"], int(e["nvlinks"]), float(e["bandwidth"])))
            else:
                cells.append("-")
        if vertex.startswith("gpu"):
            gpu = topology.gpus[gpus.index(int(vertex[3:]))]
            numa = str(gpu.numa_node) if gpu.numa_node is not None else "N/A"
            cells += [numa, gpu.cpu_affinity or "N/A"]
        else:
            cells += ["", ""]
        rows.append([name, *cells])
    models = sorted({g.model for g in topology.gpus if g.model})
    head = f"Node {record.name}: {len(gpus)} x {', '.join(models) or 'unknown model'}"
    if topology.nvswitch:
        head += f", NVSwitch (NV{max((lk.nvlinks for lk in topology.gpu_links), default=0)} per GPU)"
    parts = [head, table(["", *names, "NUMA", "CPU Affinity"], rows), "", TOPO_LEGEND]
    if topology.nics:
        parts += ["", "NICs:", *(f"  NIC{n.index}: {n.name}" for n in topology.nics)]
    bad = [h for h in record.health if not h.healthy or h.cordoned]
    if bad:
        parts += ["", "GPU health:"]
        parts += [
            f"  GPU{h.index}: {'unhealthy' if not h.healthy else 'healthy'}"
            + (", cordoned" if h.cordoned else "")
            + (f" ({h.reason})" if h.reason else "")
            for h in bad
        ]
    return "\n".join(parts)


def _grant_text(grants: Sequence[GpuGrant]) -> str:
    if not grants:
        return "-"
    if all(g.whole for g in grants):
        return "whole"
    if all(g.mig_uuid for g in grants):
        return "MIG " + ",".join(g.mig_uuid for g in grants)
    return ",".join(f"{g.memory_mib}Mi/{g.units}u" for g in grants)


def format_pods(
    ledgers: Mapping[str, Ledger], pods: Sequence[PodAllocation], namespace: str | None = None
) -> str:
    """`kubectl linkpack pods`: every allocation in the ledgers, checked against the pods."""
    by_uid = {p.uid: p for p in pods}
    rows = []
    seen: set[str] = set()
    for node in sorted(ledgers):
        for entry in ledgers[node].entries:
            if namespace is not None and entry.namespace != namespace:
                continue
            seen.add(entry.pod_uid)
            pod = by_uid.get(entry.pod_uid)
            a = entry.allocation
            if pod is None:
                state = "pod not found (stale; the extender releases it)"
            elif pod.allocation != a:
                state = "pod annotation differs from the ledger"
            elif pod.phase in ("Succeeded", "Failed"):
                state = f"finished ({pod.phase})"
            elif pod.node_name == node:
                state = "bound"
            elif pod.node_name:
                state = f"bound to another node ({pod.node_name})"
            else:
                state = "reserved, not bound yet"
            rows.append(
                [
                    entry.namespace,
                    entry.name,
                    node,
                    ",".join(str(i) for i in a.gpu_indices),
                    _grant_text(a.grants),
                    a.enforcement.value,
                    state,
                ]
            )
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if pod.uid in seen or (namespace is not None and pod.namespace != namespace):
            continue
        if pod.allocation is None:
            rows.append(
                [pod.namespace, pod.name, pod.node_name or "-", "-", "-", "-", f"bad annotation: {pod.error}"]
            )
            continue
        a = pod.allocation
        gone = pod.phase in ("Succeeded", "Failed")
        rows.append(
            [
                pod.namespace,
                pod.name,
                a.node,
                ",".join(str(i) for i in a.gpu_indices),
                _grant_text(a.grants),
                a.enforcement.value,
                f"finished ({pod.phase}), released" if gone else "annotation only: not in the ledger",
            ]
        )
    if not rows:
        return "No GPU allocations found."
    return table(["NAMESPACE", "NAME", "NODE", "GPUS", "SHARE", "ENFORCEMENT", "STATE"], rows)


def _num(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else ("-" if value is None else str(value))


def format_explain(doc: Mapping[str, Any]) -> str:
    """`kubectl linkpack explain`: the extender's explanation as text."""
    pod = doc.get("pod") or {}
    lines = [f"Pod {pod.get('namespace')}/{pod.get('name')}: {doc.get('status')}", f"  {doc.get('summary')}"]
    request = doc.get("request")
    if isinstance(request, Mapping):
        lines.append("Request: " + _request_text(request))
    if doc.get("lastDecisionAt"):
        lines.append(f"Last decision: {doc['lastDecisionAt']}")
    bound = doc.get("bound")
    if isinstance(bound, Mapping):
        lines.append(
            f"Allocation: {bound.get('node')} GPUs {bound.get('gpus')} ({_grant_text(_grants(bound))}, "
            f"enforcement {bound.get('enforcement')}, reserved {bound.get('reservedAt')})"
        )
    if doc.get("bindError"):
        lines.append(f"Bind error: {doc['bindError']}")
    rows = []
    for row in doc.get("nodes") or []:
        terms = row.get("terms") or {}
        rows.append(
            [
                str(row.get("node")),
                str(row.get("filter")),
                _num(row.get("score")),
                _num(terms.get("linkQuality")),
                _num(terms.get("fragmentation")),
                _num(terms.get("packing")),
                ",".join(str(g) for g in row.get("gpus") or []) or "-",
                str(row.get("reason") or ""),
            ]
        )
    if rows:
        lines += ["", table(["NODE", "FILTER", "SCORE", "LINK", "FRAG", "PACK", "GPUS", "REASON"], rows)]
    now = doc.get("now")
    if isinstance(now, Mapping):
        lines += ["", f"Now: {now.get('summary')}"]
    return "\n".join(lines)


def _grants(doc: Mapping[str, Any]) -> list[GpuGrant]:
    return [
        GpuGrant(
            int(g["index"]),
            str(g.get("uuid") or ""),
            bool(g.get("whole")),
            int(g.get("memoryMiB") or 0),
            int(g.get("units") or 0),
            str(g.get("migUuid") or ""),
        )
        for g in doc.get("grants") or []
    ]


def _request_text(request: Mapping[str, Any]) -> str:
    if "error" in request:
        return f"invalid: {request['error']}"
    kind = request.get("kind")
    if kind == "whole":
        text = f"{request.get('gpus')} whole GPU(s)" + (
            f" near NIC {request['nearNic']}" if request.get("nearNic") else ""
        )
    elif kind == "share":
        text = f"a GPU share: {request.get('memoryMiB')} MiB, {request.get('units')} units"
    else:
        text = f"MIG slice {request.get('profile')}"
    policy = request.get("policy") or {}
    weights = policy.get("weights") or {}
    text += (
        f"; policy {policy.get('name')} (link {weights.get('linkQuality'):g}, "
        f"fragmentation {weights.get('fragmentation'):g}, packing {weights.get('packing'):g})"
        if weights
        else ""
    )
    if policy.get("minBottleneckGbps"):
        text += f", at least {policy['minBottleneckGbps']:g} GB/s between GPUs"
    return text


# ----------------------------------------------------------------------------- fetching


class Source(Protocol):
    def topologies(self) -> list[dict[str, Any]]: ...

    def topology(self, name: str) -> dict[str, Any] | None: ...

    def ledgers(self) -> list[dict[str, Any]]: ...

    def pods(self, namespace: str | None) -> list[dict[str, Any]]: ...

    def explain(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]: ...

    def default_namespace(self) -> str: ...


def kubeconfig_path(explicit: str | None) -> str | None:
    """--kubeconfig, else $KUBECONFIG, else ~/.kube/config when it exists, else None (in-cluster)."""
    if explicit:
        return explicit
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    home = Path.home() / ".kube" / "config"
    return str(home) if home.exists() else None


def _body(raw: Any) -> dict[str, Any]:
    data = raw.data if hasattr(raw, "data") else raw
    doc = json.loads(data)
    return doc if isinstance(doc, dict) else {}


def _api_failure(exc: Exception, what: str) -> PluginError:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message") or exc.reason
        except (ValueError, AttributeError):
            message = exc.reason
        return PluginError(f"{what}: HTTP {exc.status} {message}")
    return PluginError(f"{what}: {exc}")


class KubeSource:
    """Reads Linkpack's objects with the Kubernetes client; explain goes to the extender."""

    def __init__(
        self,
        kubeconfig: str | None,
        context: str | None,
        system_namespace: str,
        extender_url: str | None,
    ) -> None:
        self._path = kubeconfig_path(kubeconfig)
        self._context = context
        self._system = system_namespace
        self._url = extender_url.rstrip("/") if extender_url else None
        self._client: client.ApiClient | None = None

    def _api(self) -> client.ApiClient:
        if self._client is None:
            try:
                if self._path:
                    from_file: Any = config.new_client_from_config
                    self._client = from_file(config_file=self._path, context=self._context)
                else:
                    load_incluster: Any = config.load_incluster_config
                    load_incluster()
                    self._client = client.ApiClient(client.Configuration.get_default_copy())
            except (config.ConfigException, OSError) as exc:
                raise PluginError(f"cannot load Kubernetes credentials: {exc}") from exc
        return self._client

    def default_namespace(self) -> str:
        if self._path:
            contexts_of: Any = config.list_kube_config_contexts
            try:
                contexts, active = contexts_of(config_file=self._path)
                if self._context:
                    active = next((c for c in contexts if c.get("name") == self._context), active)
                return str((active or {}).get("context", {}).get("namespace") or "default")
            except (config.ConfigException, OSError):
                return "default"
        token_dir = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return token_dir.read_text().strip() if token_dir.exists() else "default"

    def topologies(self) -> list[dict[str, Any]]:
        custom: Any = client.CustomObjectsApi(self._api())
        try:
            doc = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False)
        except Exception as exc:
            raise _api_failure(exc, "listing GpuTopology objects") from exc
        return list(_body(doc).get("items") or [])

    def topology(self, name: str) -> dict[str, Any] | None:
        custom: Any = client.CustomObjectsApi(self._api())
        try:
            return _body(
                custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_failure(exc, f"reading GpuTopology {name}") from exc
        except Exception as exc:
            raise _api_failure(exc, f"reading GpuTopology {name}") from exc

    def ledgers(self) -> list[dict[str, Any]]:
        core: Any = client.CoreV1Api(self._api())
        try:
            raw = core.list_namespaced_config_map(
                self._system, label_selector=f"{LEDGER_LABEL}=true", _preload_content=False
            )
        except Exception as exc:
            raise _api_failure(exc, f"listing ledger ConfigMaps in {self._system}") from exc
        return list(_body(raw).get("items") or [])

    def pods(self, namespace: str | None) -> list[dict[str, Any]]:
        core: Any = client.CoreV1Api(self._api())
        try:
            if namespace is None:
                raw = core.list_pod_for_all_namespaces(_preload_content=False)
            else:
                raw = core.list_namespaced_pod(namespace, _preload_content=False)
        except Exception as exc:
            raise _api_failure(exc, "listing pods") from exc
        return list(_body(raw).get("items") or [])

    def explain(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        path = f"debug/explain/{quote(namespace, safe='')}/{quote(name, safe='')}"
        if self._url:
            try:
                reply = httpx.get(f"{self._url}/{path}", timeout=_TIMEOUT_S)
            except httpx.HTTPError as exc:
                raise PluginError(f"asking the extender at {self._url}: {exc}") from exc
            return reply.status_code, _json_or_text(reply.text)
        api = self._api()
        api.configuration.safe_chars_for_path_param = "/"  # the proxied path keeps its slashes
        core: Any = client.CoreV1Api(api)
        where = f"the extender through the service proxy of {self._system}/{EXTENDER_SERVICE}"
        try:
            raw = core.connect_get_namespaced_service_proxy_with_path(
                EXTENDER_SERVICE, self._system, path, _preload_content=False, _request_timeout=_TIMEOUT_S
            )
            return int(raw.status), _json_or_text(raw.data.decode())
        except ApiException as exc:
            body = exc.body.decode() if isinstance(exc.body, bytes) else str(exc.body or "")
            doc = _json_or_text(body)
            if exc.status == 404 and "pod" in doc:
                return 404, doc  # the extender's own answer, passed through by the proxy
            raise _api_failure(exc, f"asking {where}") from exc
        except Exception as exc:
            raise _api_failure(exc, f"asking {where}") from exc


def _json_or_text(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {"error": text.strip()[:500]}
    return doc if isinstance(doc, dict) else {"error": str(doc)}


# ----------------------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl linkpack", description="Linkpack's view of the cluster's GPUs (see the operator guide)."
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument(
        "--system-namespace",
        default=SYSTEM_NAMESPACE,
        help=f"Linkpack's namespace (default {SYSTEM_NAMESPACE})",
    )
    p.add_argument(
        "--units-per-gpu",
        type=int,
        default=int(os.environ.get("LINKPACK_UNITS_PER_GPU", DEFAULT_UNITS_PER_GPU)),
        help="share units per GPU, as the extender is configured (default LINKPACK_UNITS_PER_GPU or 100)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("nodes", help="GPUs per node: free, shared, whole, unhealthy, cordoned")
    topo = sub.add_parser("topo", help="a node's link matrix with kinds and GB/s")
    topo.add_argument("node")
    pods = sub.add_parser("pods", help="which pod holds which GPUs and shares")
    pods.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    explain = sub.add_parser("explain", help="why a pod is pending or placed where it is")
    explain.add_argument("pod", help="NAME, or NAMESPACE/NAME")
    explain.add_argument("-n", "--namespace", help="the pod's namespace (default: the context's)")
    explain.add_argument("-o", "--output", choices=("text", "json"), default="text")
    explain.add_argument(
        "--extender-url",
        default=os.environ.get(URL_ENV),
        help=f"ask the extender here (default ${URL_ENV}, else through the API server's service proxy)",
    )
    return p


def run(args: argparse.Namespace, source: Source, out: TextIO, now: dt.datetime | None = None) -> int:
    """Carry out one parsed command against `source`; returns the exit status."""
    now = now or dt.datetime.now(dt.UTC)
    if args.command == "nodes":
        records = [node_record(o) for o in source.topologies()]
        ledgers, errors = ledgers_from(source.ledgers())
        print(format_nodes(records, ledgers, now, args.units_per_gpu, errors), file=out)
        return 0
    if args.command == "topo":
        obj = source.topology(args.node)
        if obj is None:
            raise PluginError(f"no GpuTopology named {args.node!r} (is the node agent running on it?)")
        print(format_topo(node_record(obj)), file=out)
        return 0
    if args.command == "pods":
        ledgers, errors = ledgers_from(source.ledgers())
        print(format_pods(ledgers, pod_allocations(source.pods(args.namespace)), args.namespace), file=out)
        for name, error in sorted(errors.items()):
            print(f"warning: ledger {name} is unreadable: {error}", file=out)
        return 0
    namespace, name = split_pod(args.pod, args.namespace, source.default_namespace)
    status, doc = source.explain(namespace, name)
    if args.output == "json":
        print(json.dumps(doc, indent=2, sort_keys=True), file=out)
    elif status == 200:
        print(format_explain(doc), file=out)
    else:
        print(f"error: {doc.get('error') or f'the extender answered HTTP {status}'}", file=out)
    return 0 if status == 200 else 1


def split_pod(text: str, namespace: str | None, default: Callable[[], str]) -> tuple[str, str]:
    if "/" in text:
        ns, _, name = text.partition("/")
        if namespace and namespace != ns:
            raise PluginError(f"{text!r} names namespace {ns!r} but -n says {namespace!r}")
        return ns, name
    return namespace or default(), text


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    source = KubeSource(
        args.kubeconfig, args.context, args.system_namespace, getattr(args, "extender_url", None)
    )
    try:
        return run(args, source, sys.stdout)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
