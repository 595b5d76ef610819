"""The command line: arguments, and each command as reads from a `ClusterReader` and a view.

`main` is the `kubectl-linkpack` entry point (kubectl finds it on PATH as `kubectl linkpack`);
`run` carries out parsed arguments against any reader, which is how the tests drive it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from contract.keys import DEFAULT_NAMESPACE
from contract.resources import ResourceConfigError, ResourceNames, units_per_gpu_from_env
from kubectl_linkpack.cluster_reader import EXTENDER_SERVICE, ClusterReader, KubeReader
from kubectl_linkpack.decoded import NodeCordons, cordons_by_node, ledgers_from, node_report, pod_allocations
from kubectl_linkpack.errors import PluginError
from kubectl_linkpack.explain_view import decode_explanation, format_explain
from kubectl_linkpack.policies_view import format_policies, policy_rows
from kubectl_linkpack.views import format_nodes, format_pods, format_topo, ledger_warning

URL_ENV = "LINKPACK_EXTENDER_URL"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _add_global_flags(p: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """The flags every command takes. kubectl lets them stand before or after the command, so
    each command's parser takes them too, without defaults of its own (a flag given before the
    command is not reset by one parsed after it)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if after_command else value

    p.add_argument(
        "--kubeconfig",
        default=default(None),
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument("--context", default=default(None), help="kubeconfig context to use")
    p.add_argument(
        "--system-namespace",
        default=default(DEFAULT_NAMESPACE),
        help=f"Linkpack's namespace, where the ledgers are (default {DEFAULT_NAMESPACE})",
    )
    p.add_argument(
        "--units-per-gpu",
        type=_positive,
        default=default(None),
        help="share units per GPU, as the extender is configured (default $LINKPACK_UNITS_PER_GPU or 100)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl linkpack", description="Linkpack's view of the cluster's GPUs (see the operator guide)."
    )
    _add_global_flags(p)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("nodes", help="GPUs per node: free, shared, whole, unhealthy, cordoned")
    topo = sub.add_parser("topo", help="a node's link matrix with kinds and GB/s, and its GPUs' state")
    topo.add_argument("node")
    sub.add_parser("policies", help="the GpuSchedulingPolicy objects and which pods use each")
    pods = sub.add_parser("pods", help="which pod holds which GPUs and shares")
    pods.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    explain = sub.add_parser("explain", help="why a pod is pending or placed where it is")
    explain.add_argument("pod", help="NAME, or NAMESPACE/NAME")
    explain.add_argument("-n", "--namespace", help="the pod's namespace (default: the context's)")
    explain.add_argument("-o", "--output", choices=("text", "json"), default="text")
    explain.add_argument(
        "--extender-url",
        default=os.environ.get(URL_ENV),
        help=f"ask the extender here (default ${URL_ENV}, else the API server's proxy to {EXTENDER_SERVICE})",
    )
    for command in sub.choices.values():
        _add_global_flags(command, after_command=True)
    return p


def run(args: argparse.Namespace, reader: ClusterReader, out: TextIO, now: dt.datetime | None = None) -> int:
    """Carry out one parsed command against `reader`; returns the exit status.

    Raises `PluginError` for what the user must fix (printed by `main`)."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        names = ResourceNames.from_env()
        units = args.units_per_gpu if args.units_per_gpu is not None else units_per_gpu_from_env()
    except ResourceConfigError as exc:
        raise PluginError(str(exc)) from exc
    if args.command == "nodes":
        return _nodes(reader, out, now, units)
    if args.command == "topo":
        return _topo(reader, out, args.node, units)
    if args.command == "policies":
        rows = policy_rows(reader.policies(), reader.namespaces(), reader.pods(None), names)
        print(format_policies(rows), file=out)
        return 0
    if args.command == "pods":
        ledgers, errors = ledgers_from(reader.ledgers())
        print(
            format_pods(ledgers, pod_allocations(reader.pods(args.namespace)), names, args.namespace),
            file=out,
        )
        for node, error in sorted(errors.items()):
            print(f"warning: {ledger_warning(node, error)}", file=out)
        return 0
    namespace, name = split_pod(args.pod, args.namespace, reader.default_namespace)
    reply = reader.explain(namespace, name)
    if args.output == "json":
        print(json.dumps(reply.doc, indent=2, sort_keys=True), file=out)
    elif reply.status == 200:
        print(format_explain(decode_explanation(reply.doc), names), file=out)
    else:
        print(f"error: {reply.doc.get('error') or f'the extender answered HTTP {reply.status}'}", file=out)
    return 0 if reply.status == 200 else 1


def _nodes(reader: ClusterReader, out: TextIO, now: dt.datetime, units: int) -> int:
    topologies = reader.topologies()
    ledgers, errors = ledgers_from(reader.ledgers())
    notes: list[str] = []
    facts: dict[str, NodeCordons] | None
    try:
        facts = cordons_by_node(reader.nodes()) if topologies else {}
    except PluginError as exc:
        facts = None
        notes.append(f"{exc}; cordoned GPUs and unschedulable nodes are not shown")
    records = [node_report(obj, facts, ledgers, units, errors) for obj in topologies]
    print(format_nodes(records, ledgers, now, errors, notes), file=out)
    return 0


def _topo(reader: ClusterReader, out: TextIO, node: str, units: int) -> int:
    obj = reader.topology(node)
    if obj is None:
        raise PluginError(f"no GpuTopology named {node!r} (is the node agent running on it?)")
    notes: list[str] = []
    facts: dict[str, NodeCordons] | None
    try:
        node_obj = reader.node(node)
        facts = cordons_by_node([node_obj] if node_obj is not None else [])
    except PluginError as exc:
        facts = None
        notes.append(f"{exc}; cordoned GPUs are not shown")
    try:
        ledger_obj = reader.ledger(node)
        ledgers, errors = ledgers_from([ledger_obj] if ledger_obj is not None else [])
    except PluginError as exc:
        ledgers, errors = {}, {node: str(exc)}
    record = node_report(obj, facts, ledgers, units, errors)
    if record.published is None:
        raise PluginError(record.error)
    print(format_topo(record), file=out)
    for note in notes:
        print(f"warning: {note}", file=out)
    return 0


def split_pod(text: str, namespace: str | None, default: Callable[[], str]) -> tuple[str, str]:
    """`NS/NAME`, or NAME in -n's namespace, else in the context's."""
    if "/" in text:
        ns, _, name = text.partition("/")
        if namespace and namespace != ns:
            raise PluginError(f"{text!r} names namespace {ns!r} but -n says {namespace!r}")
        return ns, name
    return namespace or default(), text


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    reader = KubeReader(
        args.kubeconfig, args.context, args.system_namespace, getattr(args, "extender_url", None)
    )
    try:
        return run(args, reader, sys.stdout)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
