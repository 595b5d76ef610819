"""`python -m node_agent`: run the node agent (see `node_agent.app` and `--help`)."""

import sys

from node_agent.app import main

sys.exit(main())
