#!/usr/bin/env bash
# Real-GPU checks of the node agent's NVML adapter and discovery, and (a separate block at the
# end) of the CUDA interposer: caps, time split, priority and overhead on a real GPU.
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
#   interposer/                  the interposer block's raw outputs and summary.txt
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

# ================================================================================================
# CUDA interposer checks on a real GPU (node_agent/sharing/interposer, "enforced fractional isolation").
#
# A separate block: it runs only where a GPU answers nvidia-smi and a C compiler and make exist,
# each check only where its own tools exist (PyTorch with CUDA, JAX on the GPU), and it does not
# change the exit status. It records what it saw under $OUT/interposer/ (raw outputs and
# summary.txt) and judges nothing: reading the figures is for whoever runs it.
#   mem-c.txt          a raw CUDA C program (driver API, a PTX kernel: no nvcc needed) under a 2 GiB
#                      interposer cap: cuMemGetInfo, then 64 MiB allocations until refused
#   mem-torch.json     PyTorch under the cap: mem_get_info, 256 MiB tensors until OOM
#   mem-jax.json       JAX (platform allocator, so XLA itself does not stop first) under the cap
#   split.txt          two processes spinning 2 ms kernels for 5 s at 30 and 70 of 100 units, and
#                      one alone without a quota (their launch counts give each one's part)
#   priority.txt       a high and a low priority process spinning on one GPU (shared state dir)
#   overhead-c.txt     launches/s of zero-length kernels: no interposer, cap only, cap + quota (x3)
#   overhead-torch.json  PyTorch MLP training step time: no interposer, cap only, cap + quota
# LINKPACK_SKIP_INTERPOSER_CHECKS=1 skips the block.
# ================================================================================================
interposer_checks() {
    local IO="$OUT/interposer"
    mkdir -p "$IO"
    local summary="$IO/summary.txt"
    : >"$summary"
    note() { echo "$*" | tee -a "$summary"; }
    if [ -n "${LINKPACK_SKIP_INTERPOSER_CHECKS:-}" ]; then note "interposer checks: skipped (LINKPACK_SKIP_INTERPOSER_CHECKS)"; return 0; fi
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! timeout 60 nvidia-smi -L >/dev/null 2>&1; then
        note "interposer checks: skipped (no GPU answers nvidia-smi)"; return 0
    fi
    local cc="${CC:-cc}"
    if ! command -v "$cc" >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
        note "interposer checks: skipped (needs a C compiler and make)"; return 0
    fi
    if ! make -s interposer INTERPOSER_BUILD="$IO/build" CC="$cc" >"$IO/build.txt" 2>&1; then
        note "interposer checks: the interposer did not build (see build.txt)"; return 0
    fi
    local lib="$IO/build/liblinkpack_cuda.so" cap=2048

    cat >"$IO/spin.c" <<'CEOF'
/* spin mem CHUNK_MIB | spin launch SECONDS KERNEL_US: the driver API only, a PTX kernel JIT-compiled
 * by the driver (no CUDA toolkit needed). Prints one line of numbers; judges nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);
CUresult cuMemAlloc_v2(unsigned long long *, size_t);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
static const char ptx[] =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry spin(.param .u64 cycles)\n{\n"
    "  .reg .pred %p<2>;\n  .reg .b64 %rd<6>;\n"
    "  ld.param.u64 %rd1, [cycles];\n  mov.u64 %rd2, %clock64;\n"
    "LOOP:\n  mov.u64 %rd3, %clock64;\n  sub.s64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p1, %rd4, %rd1;\n  @%p1 bra LOOP;\n  ret;\n}\n";
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (argc < 3 || cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) {
        printf("error init\n");
        return 1;
    }
    if (!strcmp(argv[1], "mem")) {
        size_t free_b, total_b, chunk = (size_t)atol(argv[2]) << 20;
        cuMemGetInfo_v2(&free_b, &total_b);
        unsigned long long p, n = 0;
        CUresult rc;
        while ((rc = cuMemAlloc_v2(&p, chunk)) == 0)
            n++;
        printf("info_free_mib %zu info_total_mib %zu allocated_mib %llu refused_with %d\n", free_b >> 20,
               total_b >> 20, n * (chunk >> 20), rc);
        return 0;
    }
    CUmodule mod;
    CUfunction fn;
    CUstream st;
    int khz = 0;
    if (argc < 4 || cuModuleLoadData(&mod, ptx) || cuModuleGetFunction(&fn, mod, "spin") || cuStreamCreate(&st, 0)) {
        printf("error module\n");
        return 1;
    }
    cuDeviceGetAttribute(&khz, 13 /* CU_DEVICE_ATTRIBUTE_CLOCK_RATE, kHz */, dev);
    double seconds = atof(argv[2]);
    unsigned long long cycles = (unsigned long long)(atof(argv[3]) * khz / 1000.0), launches = 0;
    void *args[] = {&cycles};
    double t0 = now(), end = t0 + seconds;
    while (now() < end) {
        if (cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, args, NULL)) {
            printf("error launch\n");
            return 1;
        }
        launches++;
    }
    cuStreamSynchronize(st);
    double wall = now() - t0;
    printf("launches %llu wall_s %.3f launches_per_s %.0f\n", launches, wall, launches / wall);
    return 0;
}
CEOF
    local spin="$IO/spin"
    if ! "$cc" -O2 -o "$spin" "$IO/spin.c" -l:libcuda.so.1 >"$IO/spin-build.txt" 2>&1; then
        note "raw CUDA C checks: skipped (spin.c did not link against libcuda.so.1, see spin-build.txt)"
        spin=""
    fi
    # run NAME [VAR=VALUE...] -- COMMAND...: under the interposer, own accounting file
    held() {
        local name=$1
        shift
        env LD_PRELOAD="$lib" LINKPACK_MEMORY_LIMIT_MIB="$cap" LINKPACK_ACCOUNTING_FILE="$IO/accounting-$name" "$@"
    }
    if [ -n "$spin" ]; then
        held c timeout 300 "$spin" mem 64 >"$IO/mem-c.txt" 2>&1
        note "raw CUDA C under a ${cap} MiB cap: $(tail -1 "$IO/mem-c.txt")"
        {
            echo "solo, no quota: $(timeout 60 "$spin" launch 5 2000)"
            held s30 LINKPACK_COMPUTE_UNITS=30 timeout 60 "$spin" launch 5 2000 >"$IO/split-30.out" 2>&1 &
            local a=$!
            held s70 LINKPACK_COMPUTE_UNITS=70 timeout 60 "$spin" launch 5 2000 >"$IO/split-70.out" 2>&1 &
            local b=$!
            wait "$a" "$b"
            echo "30 units, beside the 70: $(tail -1 "$IO/split-30.out")"
            echo "70 units, beside the 30: $(tail -1 "$IO/split-70.out")"
        } >"$IO/split.txt" 2>&1
        note "30/70 split (2 ms kernels, 5 s): see split.txt"
        mkdir -p "$IO/gpu-state"
        {
            held ph LINKPACK_COMPUTE_PRIORITY=high LINKPACK_GPU_STATE_DIR="$IO/gpu-state" \
                timeout 60 "$spin" launch 5 2000 >"$IO/prio-high.out" 2>&1 &
            local h=$!
            held pl LINKPACK_COMPUTE_PRIORITY=low LINKPACK_GPU_STATE_DIR="$IO/gpu-state" \
                timeout 60 "$spin" launch 5 2000 >"$IO/prio-low.out" 2>&1 &
            local l=$!
            wait "$h" "$l"
            echo "high: $(tail -1 "$IO/prio-high.out")"
            echo "low:  $(tail -1 "$IO/prio-low.out")"
        } >"$IO/priority.txt" 2>&1
        note "priority high vs low (2 ms kernels, 5 s): see priority.txt"
        {
            for run in 1 2 3; do
                echo "run $run without:     $(timeout 60 "$spin" launch 3 0)"
                echo "run $run cap:         $(held o$run timeout 60 "$spin" launch 3 0)"
                echo "run $run cap + quota: $(held q$run LINKPACK_COMPUTE_UNITS=99 timeout 60 "$spin" launch 3 0)"
            done
        } >"$IO/overhead-c.txt" 2>&1
        note "raw CUDA launch overhead (zero-length kernels): see overhead-c.txt"
    fi

    if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
        cat >"$IO/torch_check.py" <<'TEOF'
import json, sys, time
import torch
out = {"mode": sys.argv[1]}
if sys.argv[1] == "mem":
    free, total = torch.cuda.mem_get_info()
    out["mem_get_info_mib"] = [free >> 20, total >> 20]
    blocks = []
    try:
        while True:
            blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        out["oom_after_mib"] = 256 * len(blocks)
else:
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 4096, device="cuda")
    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        step()
    torch.cuda.synchronize()
    out["step_ms"] = (time.perf_counter() - t) / 200 * 1000
print(json.dumps(out))
TEOF
        held tm timeout 300 $PY "$IO/torch_check.py" mem >"$IO/mem-torch.json" 2>"$IO/mem-torch.stderr"
        note "PyTorch under a ${cap} MiB cap: $(tail -1 "$IO/mem-torch.json")"
        {
            for run in 1 2 3; do
                echo "run $run without:     $(timeout 300 $PY "$IO/torch_check.py" step)"
                echo "run $run cap:         $(held t$run timeout 300 $PY "$IO/torch_check.py" step)"
                echo "run $run cap + quota: $(held u$run LINKPACK_COMPUTE_UNITS=99 timeout 300 $PY "$IO/torch_check.py" step)"
            done
        } >"$IO/overhead-torch.json" 2>&1
        note "PyTorch step overhead: see overhead-torch.json"
    else
        note "PyTorch checks: skipped (no torch with CUDA for $PY)"
    fi

    if $PY -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 1)" >/dev/null 2>&1; then
        cat >"$IO/jax_check.py" <<'JEOF'
import json
import jax, jax.numpy as jnp
out = {"backend": jax.default_backend()}
arrays = []
try:
    while True:
        arrays.append(jnp.ones((64 << 20,), jnp.float32).block_until_ready())  # 256 MiB each
except Exception as exc:  # XLA reports the refused allocation as its own error type
    out["failed_after_mib"] = 256 * len(arrays)
    out["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
print(json.dumps(out))
JEOF
        held jx XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform \
            timeout 300 $PY "$IO/jax_check.py" >"$IO/mem-jax.json" 2>"$IO/mem-jax.stderr"
        note "JAX under a ${cap} MiB cap: $(tail -1 "$IO/mem-jax.json")"
    else
        note "JAX checks: skipped (no JAX on the GPU for $PY)"
    fi
    grep -h "linkpack-interposer:" "$IO"/*.txt "$IO"/*.out "$IO"/*.stderr 2>/dev/null | sort -u >"$IO/interposer-reports.txt"
    note "interposer reports (limits it could not hold): $(wc -l <"$IO/interposer-reports.txt") lines in interposer-reports.txt"
}
interposer_checks

echo "pytest exit status: $status (details in $OUT/pytest.txt)"
tail -5 "$OUT/pytest.txt"
exit "$status"
