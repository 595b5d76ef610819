"""Whether CUDA MPS serves this node's GPU shares: decided here, once, for the whole agent.

The node says `mps.active` in its GpuTopology status when it was configured with the pipe
directory of an MPS control daemon (`--mps-pipe-dir`) and that directory exists. That is all
it checks: it does not talk to the daemon, so a daemon that died but left its directory behind
still counts as active (supervising the daemon is future work). The extender decides each
share's enforcement from this status at bind time and records it in the allocation; the device
plugin applies the record, and checks the directory again when it hands a share out.
"""

from __future__ import annotations

from pathlib import Path


def mps_active(pipe_dir: str | None) -> bool:
    """A pipe directory is configured and exists."""
    return pipe_dir is not None and Path(pipe_dir).is_dir()
