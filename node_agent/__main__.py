"""`python -m node_agent`: run the node agent (see `node_agent.wiring` and `--help`)."""

import sys

from node_agent.config import parse_args


def _main() -> int:
    config = parse_args()  # before wiring is imported: `--help` and bad flags need no gRPC stubs
    from node_agent.wiring import run

    return run(config)


sys.exit(_main())
