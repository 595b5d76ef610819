#!/usr/bin/env python3
"""Real-GPU check of Linkpack's framework shim (node_agent/sharing/shim) with PyTorch and, if present, JAX.

Run from the repository root on a machine with an NVIDIA GPU and torch built with CUDA:

    python3 scripts/gpu-shim-check.py [--limit-mib 2048] [--out results.json]

Each case runs in a child Python whose environment is what the device plugin gives a container
holding a share of GPU 0: PYTHONPATH = the shim directory, LINKPACK_MEMORY_LIMIT_MIB and
LINKPACK_MEMORY_FRACTION for the limit. With the shim, allocating half the limit must work and
allocating 1.5 times it must fail with an out-of-memory error; without the shim (the control)
the same 1.5x allocation must work. Prints one JSON document; exits 0 when every case behaved.
Needs nothing from the project but the shim files themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parent.parent / "node_agent" / "sharing" / "shim"

TORCH_CHILD = """
import json, os, sys
out = {}
import torch
shim = sys.modules.get("linkpack_shim")
out["shim_loaded"] = shim is not None
out["applied_at_import"] = repr(shim.applied.get("torch")) if shim else None
out["cuda_initialised_by_import"] = torch.cuda.is_initialized()
mib = 1024 * 1024
small, large = int(LIMIT * 0.5), int(LIMIT * 1.5)
keep = torch.empty(small * mib, dtype=torch.uint8, device="cuda:0")
out["small_alloc_mib"] = small
if hasattr(torch.cuda, "get_per_process_memory_fraction"):
    out["fraction_in_torch"] = torch.cuda.get_per_process_memory_fraction(0)
out["applied_after_init"] = repr(shim.applied.get("torch")) if shim else None
try:
    big = torch.empty(large * mib, dtype=torch.uint8, device="cuda:0")
    out["large_alloc"] = "succeeded"
    del big
except torch.cuda.OutOfMemoryError as exc:
    out["large_alloc"] = "out of memory"
    out["oom_message"] = str(exc).splitlines()[0][:300]
out["large_alloc_mib"] = large
print(json.dumps(out))
"""

JAX_CHILD = """
import json, os, sys
out = {k: os.environ.get(k) for k in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION",
                                      "XLA_PYTHON_CLIENT_PREALLOCATE")}
import jax, jax.numpy as jnp
out["devices"] = [str(d) for d in jax.devices()]
mib = 1024 * 1024
small, large = int(LIMIT * 0.5), int(LIMIT * 1.5)
keep = jnp.zeros((small * mib,), dtype=jnp.uint8).block_until_ready()
out["small_alloc_mib"] = small
try:
    big = jnp.zeros((large * mib,), dtype=jnp.uint8).block_until_ready()
    out["large_alloc"] = "succeeded"
    del big
except Exception as exc:
    text = str(exc)
    out["large_alloc"] = "out of memory" if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() else "error"
    out["error"] = text.splitlines()[0][:300]
out["large_alloc_mib"] = large
print(json.dumps(out))
"""


def run_child(code: str, limit_mib: int, env: dict[str, str]) -> dict[str, object]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LINKPACK_", "XLA_"))}
    full.update(env)
    full["CUDA_VISIBLE_DEVICES"] = full.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code).replace("LIMIT", str(limit_mib))],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"failed": True, "rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr[-1000:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit-mib", type=int, default=2048)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    report: dict[str, object] = {"limit_mib": args.limit_mib, "shim_dir": str(SHIM_DIR)}
    try:
        import torch
    except ImportError:
        report["skipped"] = "torch is not installed"
        print(json.dumps(report, indent=2))
        return 2
    if not torch.cuda.is_available():
        report["skipped"] = "torch sees no CUDA device"
        print(json.dumps(report, indent=2))
        return 2
    props = torch.cuda.get_device_properties(0)
    total_mib = props.total_memory // (1024 * 1024)
    fraction = f"{int(args.limit_mib * 1_000_000 / total_mib) / 1_000_000:.6f}"
    report.update(
        {"gpu": props.name, "total_mib": total_mib, "fraction": fraction, "torch": torch.__version__}
    )
    share = {
        "PYTHONPATH": str(SHIM_DIR),
        "LINKPACK_MEMORY_LIMIT_MIB": str(args.limit_mib),
        "LINKPACK_MEMORY_FRACTION": fraction,
        "LINKPACK_ENFORCEMENT": "cooperative",
    }
    cases: dict[str, dict[str, object]] = {
        "torch_with_shim": run_child(TORCH_CHILD, args.limit_mib, share),
        "torch_without_shim": run_child(TORCH_CHILD, args.limit_mib, {}),
    }
    expected = {"torch_with_shim": "out of memory", "torch_without_shim": "succeeded"}
    try:
        import jax  # noqa: F401  (only whether it is there)

        cases["jax_with_shim"] = run_child(JAX_CHILD, args.limit_mib, share)
        cases["jax_without_shim"] = run_child(
            JAX_CHILD, args.limit_mib, {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        )
        expected.update({"jax_with_shim": "out of memory", "jax_without_shim": "succeeded"})
    except ImportError:
        report["jax"] = "not installed; skipped"
    for name, case in cases.items():
        case["as_expected"] = case.get("large_alloc") == expected[name]
    extra = cases["torch_with_shim"]
    extra_ok = extra.get("cuda_initialised_by_import") is False and extra.get("shim_loaded") is True
    report["cases"] = cases
    report["torch_import_left_cuda_uninitialised"] = extra.get("cuda_initialised_by_import") is False
    report["ok"] = all(c["as_expected"] for c in cases.values()) and extra_ok
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
