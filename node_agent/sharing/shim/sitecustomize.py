"""Python imports this at start-up when its directory is on PYTHONPATH (the device plugin puts
/opt/linkpack/shim there for containers given a GPU share): apply Linkpack's GPU share to the
ML frameworks this process will use. See linkpack_shim.py.

An image may have a sitecustomize of its own; ours shadows it, so after activating the shim
the next `sitecustomize` on sys.path is run too. Nothing here may ever break the program.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys


def _activate_shim() -> None:
    try:
        # a sibling file, importable only from the container's PYTHONPATH (not as node_agent.sharing.shim.*)
        import linkpack_shim  # type: ignore[import-not-found]

        linkpack_shim.activate()
    except Exception as exc:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"linkpack-shim: not active: {type(exc).__name__}: {exc}\n")


def _run_shadowed_sitecustomize() -> None:
    """Run the image's own sitecustomize, the first one on sys.path after this directory."""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        later = [p for p in sys.path if p and os.path.abspath(p) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
        if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"linkpack-shim: the image's own sitecustomize failed: {type(exc).__name__}: {exc}\n"
            )


_activate_shim()
_run_shadowed_sitecustomize()
