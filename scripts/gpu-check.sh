#!/usr/bin/env bash
# Real-GPU checks of the node agent's NVML adapter and discovery.
#
# Run from the repository root on a machine with an NVIDIA driver:
#   OUT=/some/dir scripts/gpu-check.sh
# Python dependencies come from ./.whl (wheels, offline) when that folder exists, else from
# the package index. Results land in $OUT (default ./gpu-check-out):
#   pytest.txt, junit.xml        the `-m gpu` tests and their outcome
#   topo-m.txt                   nvidia-smi topo -m
#   nvidia-smi-q.txt             the first 80 lines of nvidia-smi -q
#   nvidia-smi-L.txt, nvlink-s.txt, env.txt
#   discovery.json               our merged discovery (topology, sources, warnings)
# The exit status is pytest's.
set -uo pipefail

OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"

PY=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c "import pynvml, pytest" 2>/dev/null; then
    PY=.venv/bin/python
elif python3 -c "import pynvml, pytest, networkx, yaml" 2>/dev/null; then
    PY=python3
elif [ -d .whl ]; then
    python3 -m pip install -q --no-index --find-links .whl nvidia-ml-py networkx pytest hypothesis pyyaml \
        >"$OUT/pip.txt" 2>&1 || echo "pip install from .whl failed (see pip.txt)" >&2
else
    python3 -m pip install -q nvidia-ml-py networkx pytest hypothesis pyyaml \
        >"$OUT/pip.txt" 2>&1 || echo "pip install failed (see pip.txt); using what is installed" >&2
fi

{
    echo "python: $($PY --version 2>&1) ($PY)"
    $PY -c "import importlib.metadata as m; print('nvidia-ml-py', m.version('nvidia-ml-py'))" 2>&1
    timeout 60 nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv 2>&1
} >"$OUT/env.txt"

timeout 60 nvidia-smi topo -m >"$OUT/topo-m.txt" 2>&1
timeout 60 nvidia-smi -q 2>&1 | head -80 >"$OUT/nvidia-smi-q.txt"
timeout 60 nvidia-smi -L >"$OUT/nvidia-smi-L.txt" 2>&1
timeout 60 nvidia-smi nvlink -s 2>&1 | head -200 >"$OUT/nvlink-s.txt"

timeout 300 $PY -m pytest -m gpu tests/node_agent/test_nvml_real_gpu.py -q -rA -p no:cacheprovider --noconftest \
    --junitxml="$OUT/junit.xml" >"$OUT/pytest.txt" 2>&1
status=$?

timeout 120 $PY - >"$OUT/discovery.json" 2>"$OUT/discovery-stderr.txt" <<'EOF'
import json
import sys

from node_agent.sources.discovery import discover
from node_agent.sources.nvml_pynvml import PynvmlReader
from node_agent.sources.smi_runner import SmiError, run_topo_matrix
from topology.codec import encode_topology

try:
    text = run_topo_matrix()
except SmiError as exc:
    text = None
    print(f"topo -m unavailable: {exc}", file=sys.stderr)
reader = PynvmlReader.open()
try:
    found = discover(reader, text)
    nvlinks = {
        i: [
            {"link": lk.link, "active": lk.active, "version": lk.version,
             "remote": lk.remote_pci_bus_id, "type": lk.remote_type.value}
            for lk in reader.nvlinks(i)
        ]
        for i in range(reader.device_count())
    }
    doc = {
        "driver": reader.driver_version(),
        "sources": dict(found.sources),
        "warnings": list(found.warnings),
        "topology": encode_topology(found.topology),
        "nvlinks": nvlinks,
    }
    print(json.dumps(doc, indent=2, sort_keys=True, default=str))
finally:
    reader.close()
EOF

echo "pytest exit status: $status (details in $OUT/pytest.txt)"
tail -5 "$OUT/pytest.txt"
exit "$status"
