"""Cluster packing benchmark: the FGD paper's trace-driven simulation (ATC'23), in-process.

`python -m bench.cluster` loads the openb node and pod lists, schedules one pod at a time
through pluggable node-scoring policies (the paper's six baselines and "ours"), and writes the
"## Cluster packing" section of docs/BENCHMARKS.md plus docs/img/cluster-packing-default.png.

Modules: `trace` (files), `protocol` (arrivals, metrics), `cluster` and `frag_table` (state,
cached FGD measure), `policy` (interfaces), `baselines`, `fgd_policy`, `ours`, `topologies`,
`simulate`, `report`, `registry`; `replay` (a sample through the real kube-scheduler and the
extender, against the simulator).
"""

import os

# The simulator's matrices are small: BLAS worker threads would only fight over the cores with
# the benchmark's own processes. Set before numpy is first imported (no effect afterwards).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
