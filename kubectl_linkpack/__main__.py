"""`python -m kubectl_linkpack`: the same program as the `kubectl-linkpack` command."""

from __future__ import annotations

from kubectl_linkpack.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
