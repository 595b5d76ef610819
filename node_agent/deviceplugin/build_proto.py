"""Generate the gRPC Python stubs for every .proto in this package into `_generated/`.

Run as `python -m node_agent.deviceplugin.build_proto`; `make` does it before tests and the demo.
"""

from __future__ import annotations

import sys
from pathlib import Path


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
    print(f"generated stubs for {len(protos)} proto file(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
