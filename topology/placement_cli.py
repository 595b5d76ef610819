"""`python -m topology place FILE --gpus K [--used 0,3] [--model M]`: place on a saved matrix.

FILE is `nvidia-smi topo -m` output (`-`: standard input). Prints JSON: `gpus` (chosen indices)
and `score` (and `uuids` when the input names them, which `topo -m` output does not), or `reason`
and `resolvable` on a misfit. Exit status 0 on a placement, 1 on a misfit, 2 on bad
input (unreadable file, matrix that does not parse, bad GPU list).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from topology.placement import place
from topology.scheduling import GpuUsage, Misfit, NodeState, Policy, WholeGpus

EXIT_PLACED = 0
EXIT_MISFIT = 1
EXIT_BAD_INPUT = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a file holding `nvidia-smi topo -m` output")
    parser.add_argument("--gpus", type=int, required=True, help="how many whole GPUs to place")
    parser.add_argument("--used", default="", help="comma-separated GPU indices already held, e.g. 0,3")
    parser.add_argument("--unhealthy", default="", help="comma-separated GPU indices to treat as unhealthy")
    parser.add_argument("--model", default="", help="GPU model when the matrix does not say (e.g. H100)")
    parser.add_argument("--memory-mib", type=int, default=0, help="memory per GPU in MiB, when known")
    parser.add_argument("--near-nic", default=None, help="prefer GPUs close to this NIC (mlx5_0 or NIC0)")
    parser.add_argument(
        "--min-bottleneck-gbps", type=float, default=0.0, help="fail unless the ring reaches this rate"
    )


def run(args: argparse.Namespace) -> int:
    try:
        text = _read(args.file)
    except OSError as exc:
        return _bad_input(f"cannot read {args.file}: {exc.strerror or exc}")
    try:
        from topology.smi_parser import parse_topo_matrix
    except ImportError:  # pragma: no cover - the parser ships with the package
        return _bad_input("the topology parser (topology.smi_parser) is not available")
    try:
        parsed = parse_topo_matrix(text, model=args.model, memory_mib=args.memory_mib)
    except ValueError as exc:
        return _bad_input(f"{args.file}: {exc}")
    topology = parsed.topology
    try:
        used = _indices(args.used, topology.gpu_count, "--used")
        unhealthy = _indices(args.unhealthy, topology.gpu_count, "--unhealthy")
    except ValueError as exc:
        return _bad_input(str(exc))
    usage = tuple(GpuUsage(whole=i in used, healthy=i not in unhealthy) for i in range(topology.gpu_count))
    node = NodeState("cli", topology, usage)
    policy = Policy(min_bottleneck_gbps=args.min_bottleneck_gbps)
    outcome = place(node, WholeGpus(args.gpus, near_nic=args.near_nic), policy)
    doc: dict[str, Any]
    if isinstance(outcome, Misfit):
        doc = {"reason": outcome.reason.name, "message": outcome.message, "resolvable": outcome.resolvable}
    else:
        score = asdict(outcome.score)
        score["terms"] = dict(outcome.score.terms)
        doc = {"gpus": list(outcome.gpus), "score": score}
        if all(g.uuid for g in outcome.grants):
            doc["uuids"] = [g.uuid for g in outcome.grants]
    if parsed.warnings:
        doc["warnings"] = list(parsed.warnings)
    print(json.dumps(doc, indent=2, sort_keys=True))
    return EXIT_MISFIT if isinstance(outcome, Misfit) else EXIT_PLACED


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _indices(text: str, gpu_count: int, flag: str) -> frozenset[int]:
    out = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"{flag}: {part!r} is not a GPU index")
        index = int(part)
        if index >= gpu_count:
            raise ValueError(f"{flag}: GPU {index} does not exist (the node has {gpu_count})")
        out.add(index)
    return frozenset(out)


def _bad_input(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m topology.placement_cli`), same arguments as `place`."""
    parser = argparse.ArgumentParser(prog="topology place", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
