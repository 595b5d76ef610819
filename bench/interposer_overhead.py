"""What the CUDA interposer costs a launch-bound program, on the fake driver (no GPU needed).

`python -m bench.interposer_overhead [--seconds 2] [--runs 3] [--kernel-us 0] [--json]`

Builds the interposer (`make interposer`), the fake `libcuda.so.1` and the launch probe of the
interposer tests (tests/interposer) into a temporary directory, then, in each run and in the same
process tree one after the other, launches kernels flat out for `--seconds` with zero-length
kernels (so the fake GPU is never the bottleneck and every launch is pure driver-API overhead):

- `without`: no interposer;
- `memory cap`: the interposer preloaded with a memory cap and no compute quota;
- `cap + quota`: the same with a compute quota that never binds (99 of 100 units: the GPU is idle
  almost all the time), so every launch pays the time-slice bookkeeping (event query and record,
  capture check, the process mutex) but never waits.

It prints launches per second of each, their ratio to `without` per run, the median ratio over the
runs and the median added time per launch. The fake's own launch is far cheaper than a real
driver's (a few microseconds), so the ratio here is a worst case for the relative cost; on a GPU
the added time is a smaller part of each launch (and the real driver's event calls, which the
quota makes, cost what they cost there: not measured here). It writes nothing: the figures go
into docs/BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS = REPO_ROOT / "tests" / "interposer"
WARNINGS = ["-O2", "-Wall", "-Wextra", "-Werror"]

#: the configurations measured, by name: what the interposer is told (None: not preloaded)
SETUPS: dict[str, dict[str, str] | None] = {
    "without": None,
    "memory cap": {"LINKPACK_MEMORY_LIMIT_MIB": "1024"},
    "cap + quota": {"LINKPACK_MEMORY_LIMIT_MIB": "1024", "LINKPACK_COMPUTE_UNITS": "99"},
}


@dataclass(frozen=True)
class Built:
    interposer: Path
    fake_dir: Path
    launchprobe: Path


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"build step failed: {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")


def build(out: Path) -> Built:
    """The interposer, the fake driver and the launch probe, as the interposer tests build them."""
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None or shutil.which("make") is None:
        raise SystemExit("needs a C compiler (cc, gcc or clang) and make")
    _run(["make", "-s", "interposer", f"INTERPOSER_BUILD={out}", f"CC={cc}"], cwd=REPO_ROOT)
    fake_dir = out / "fake"
    fake_dir.mkdir()
    fake = fake_dir / "libcuda.so.1"
    _run([cc, *WARNINGS, "-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic-functions",
          "-Wl,-soname,libcuda.so.1", "-o", str(fake), str(TESTS / "fake_cuda" / "fake_libcuda.c"), "-lpthread"])  # fmt: skip
    (fake_dir / "libcuda.so").symlink_to("libcuda.so.1")
    probe = out / "launchprobe"
    _run(
        [
            cc,
            *WARNINGS,
            "-o",
            str(probe),
            str(TESTS / "programs" / "launchprobe.c"),
            "-L",
            str(fake_dir),
            "-lcuda",
        ]
    )
    return Built(out / "liblinkpack_cuda.so", fake_dir, probe)


def launches_per_second(
    built: Built, setup: dict[str, str] | None, seconds: float, kernel_us: int, tmp: Path
) -> float:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LINKPACK_", "FAKE_CUDA_")) and k != "LD_PRELOAD"
    }
    env["LD_LIBRARY_PATH"] = str(built.fake_dir)
    if setup is not None:
        env.update(setup)
        env["LD_PRELOAD"] = str(built.interposer)
        env["LINKPACK_ACCOUNTING_FILE"] = str(tmp / f"accounting-{os.getpid()}-{len(os.listdir(tmp))}")
    done = subprocess.run(
        [str(built.launchprobe), str(seconds), str(kernel_us)],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    lines = [line.split() for line in done.stdout.splitlines()]
    if done.returncode != 0 or not lines or lines[0][0] != "start" or lines[-1][0] != "end":
        raise SystemExit(f"launchprobe failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    if "linkpack-interposer:" in done.stderr:
        raise SystemExit(f"the interposer could not hold its limits: {done.stderr}")
    t0, t1, launches = int(lines[0][1]), int(lines[-1][1]), int(lines[-1][2])
    return launches * 1e9 / (t1 - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.interposer_overhead", description=__doc__.splitlines()[0]
    )
    p.add_argument("--seconds", type=float, default=2.0, help="launching time of each measurement")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kernel-us", type=int, default=0, help="kernel length on the fake GPU (0: launch-bound)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lp-bench-interposer-") as scratch:
        out = Path(scratch)
        built = build(out / "build")
        tmp = out / "run"
        tmp.mkdir()
        runs: list[dict[str, float]] = []
        for _ in range(a.runs):
            runs.append(
                {
                    name: launches_per_second(built, s, a.seconds, a.kernel_us, tmp)
                    for name, s in SETUPS.items()
                }
            )
    ratios = {name: [r[name] / r["without"] for r in runs] for name in SETUPS if name != "without"}
    added_ns = {name: [1e9 / r[name] - 1e9 / r["without"] for r in runs] for name in ratios}
    result = {
        "seconds": a.seconds,
        "kernel_us": a.kernel_us,
        "runs": runs,
        "ratios": ratios,
        "median_ratio": {name: statistics.median(values) for name, values in ratios.items()},
        "median_added_ns_per_launch": {name: statistics.median(values) for name, values in added_ns.items()},
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"launch-bound on the fake driver: {a.seconds:g} s of {a.kernel_us} us kernels per measurement")
    print(f"{'run':>3} " + " ".join(f"{name + ' launches/s':>24}" for name in SETUPS))
    for i, r in enumerate(runs, 1):
        print(f"{i:>3} " + " ".join(f"{r[name]:>24,.0f}" for name in SETUPS))
    for name, values in ratios.items():
        shown = ", ".join(f"{v:.3f}" for v in values)
        added = statistics.median(added_ns[name])
        print(
            f"{name}: ratio to without {shown}; median {statistics.median(values):.3f} (+{added:.0f} ns a launch)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
