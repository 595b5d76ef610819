"""Generate the gRPC Python stubs for every .proto in this package into `_generated/`.

Run as `python -m node_agent.deviceplugin.build_proto`; `make` does it before tests and the demo.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# protoc writes `import foo_pb2 as foo__pb2` into foo_pb2_grpc.py, which only resolves when
# `_generated/` itself is on sys.path; inside the package it must be a relative import.
_ABSOLUTE_STUB_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def main() -> int:
    from grpc_tools import protoc  # build-time tool, dev dependency

    here = Path(__file__).resolve().parent
    out = here / "_generated"
    out.mkdir(exist_ok=True)
    (out / "__init__.py").touch()
    protos = sorted(here.glob("*.proto"))
    for proto in protos:
        rc: int = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{here}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                f"--pyi_out={out}",
                str(proto),
            ]
        )
        if rc != 0:
            print(f"protoc failed on {proto.name}", file=sys.stderr)
            return rc
    for grpc_stub in sorted(out.glob("*_pb2_grpc.py")):
        _make_stub_imports_relative(grpc_stub)
    print(f"generated stubs for {len(protos)} proto file(s)")
    return 0


def _make_stub_imports_relative(path: Path) -> None:
    text = path.read_text()
    fixed = _ABSOLUTE_STUB_IMPORT.sub(r"from . import \1 as \2", text)
    if fixed != text:
        path.write_text(fixed)


if __name__ == "__main__":
    raise SystemExit(main())
