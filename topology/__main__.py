"""`python -m topology parse FILE [--model M --memory-mib N]` prints the topology as codec JSON.

FILE `-` reads standard input. Bad input prints `error: line N: ...` to stderr and exits 2. The
`place` subcommand is provided by `topology.placement_cli` when that module exists. A reader
that closes the pipe early (`| head`) ends the command quietly with status 141, as a process
stopped by SIGPIPE.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from topology.codec import encode_topology
from topology.smi_parser import TopologyParseError, parse_topo_matrix

EXIT_BAD_INPUT = 2
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a writer its reader left
_Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topology", description="Linkpack topology tools")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_parse_command(subparsers)
    _add_place_command(subparsers)
    args = parser.parse_args(argv)
    handler = cast(_Handler, args.handler)
    return handler(args)


def _add_parse_command(subparsers: Any) -> None:
    parse = subparsers.add_parser("parse", help="parse `nvidia-smi topo -m` output into topology JSON")
    parse.add_argument("file", help="a file holding `nvidia-smi topo -m` output, or - for standard input")
    parse.add_argument("--model", default="", help="GPU model to record on every GPU")
    parse.add_argument("--memory-mib", type=int, default=0, help="GPU memory (MiB) to record on every GPU")
    parse.set_defaults(handler=_run_parse)


def _run_parse(args: argparse.Namespace) -> int:
    name = cast(str, args.file)
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        print(f"error: cannot read {name}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    text = raw.decode("utf-8", errors="replace")
    try:
        result = parse_topo_matrix(text, model=args.model, memory_mib=args.memory_mib)
    except TopologyParseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps(encode_topology(result.topology), indent=2))
    return 0


def _add_place_command(subparsers: Any) -> None:
    """`place`, from `topology.placement_cli` (`add_arguments(parser)`, `run(args) -> int`) if present."""
    if importlib.util.find_spec("topology.placement_cli") is None:
        return
    placement_cli = importlib.import_module("topology.placement_cli")
    place = subparsers.add_parser("place", help="choose GPUs for a request on a topology")
    placement_cli.add_arguments(place)
    place.set_defaults(handler=placement_cli.run)


def run_command(argv: Sequence[str] | None = None) -> int:
    """`main`, with a pipe its reader closed early ending the command quietly."""
    try:
        code = main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # Nothing more can be written, and Python would report the failed flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    return code


if __name__ == "__main__":
    sys.exit(run_command())
