"""The one vocabulary of GPU states that Linkpack shows people.

The extender's debug page (its legend, GPU colours and counts) and the kubectl plugin
(`kubectl linkpack nodes`) both describe a GPU with one of the words in `GPU_STATUSES`, and a
node's GPUs with `model_of`. Keeping the words here, next to the `GpuUsage` they are read from,
means the page and the CLI can never disagree about what "shared" or "cordoned" means.

Pure functions over `topology.scheduling` values; no I/O.
"""

from __future__ import annotations

from typing import Final

from topology.scheduling import GpuUsage, NodeState

#: What a GPU is doing, in the order legends and tables list them.
GPU_STATUSES: Final = ("free", "shared", "whole", "unhealthy", "cordoned")


def gpu_status(usage: GpuUsage) -> str:
    """One word for a GPU: unhealthy and cordoned win over use; any share or MIG use is "shared"."""
    if not usage.healthy:
        return "unhealthy"
    if usage.cordoned:
        return "cordoned"
    if usage.whole:
        return "whole"
    return "free" if usage.idle else "shared"


def model_of(state: NodeState) -> str:
    """The node's GPU model; "mixed: A, B" when its GPUs differ, "" when none reports one."""
    models = sorted({g.model for g in state.topology.gpus if g.model})
    if len(models) == 1:
        return models[0]
    return "mixed: " + ", ".join(models) if models else ""
