"""Builds the interposer (with `make interposer`), the fake libcuda.so.1 and the test programs once per session.

Everything goes into a pytest temporary directory. The tests are skipped, with the reason, only when
there is no C compiler; a build that fails fails the tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
INTERPOSER_SRC = REPO / "node_agent" / "sharing" / "interposer"
HOOKS_HEADER = INTERPOSER_SRC / "lp_hooks.h"
WARNINGS = ["-O2", "-Wall", "-Wextra", "-Werror"]
# The fake driver and the probes use the interposer's CUDA types and entry-point lists
# (lp_cuda_types.h, lp_hooks.h) through programs/probe_cuda.h.
INCLUDES = ["-I", str(INTERPOSER_SRC), "-I", str(PROGRAMS)]

# variables of the interposer, the fake and the container that must not leak in from the caller
_SCRUBBED_PREFIXES = ("LINKPACK_", "FAKE_CUDA_")
_SCRUBBED = {"LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"build step failed: {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")


def _library(cc: str, name: str) -> str | None:
    """The path of a shared library the compiler would link, or None."""
    done = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True, check=False)
    path = done.stdout.strip()
    return path if path.startswith("/") else None


@dataclass(frozen=True)
class Hook:
    """An entry point the interposer wraps, as lp_hooks.h lists it: cuGetProcAddress(family) answers
    with `name` from CUDA version `since` on, for the per-thread default stream where `per_thread`."""

    name: str
    family: str
    since: int
    per_thread: bool


def hooked_entry_points() -> list[Hook]:
    """The LP_HOOKED_FUNCS entries of lp_hooks.h, the interposer's one list of what it wraps."""
    text = HOOKS_HEADER.read_text().replace("\\\n", " ")
    body = next(line for line in text.splitlines() if line.startswith("#define LP_HOOKED_FUNCS(X)"))
    entries = re.findall(r"\bX\((\w+), (\w+), (\d+), ([01]),", body)
    assert entries and len(entries) == len(re.findall(r"\bX\(", body)), (
        f"unreadable entries in {HOOKS_HEADER}"
    )
    return [Hook(name, family, int(since), per_thread == "1") for name, family, since, per_thread in entries]


@dataclass(frozen=True)
class Build:
    """Paths of what was built, and the environment a test program runs in."""

    interposer: Path
    fake_dir: Path
    memprobe: Path
    launchprobe: Path
    nextprobe: Path
    ctypes_probe: Path

    def env(self, tmp: Path, **overrides: object) -> dict[str, str]:
        """The caller's environment without interposer settings, plus LD_PRELOAD, the fake driver, a fresh
        accounting file under `tmp` and `overrides` (a value of None removes the variable)."""
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES) and k not in _SCRUBBED
        }
        library_path = os.environ.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{self.fake_dir}:{library_path}" if library_path else str(self.fake_dir)
        env["LD_PRELOAD"] = str(self.interposer)
        env["LINKPACK_ACCOUNTING_FILE"] = str(tmp / "accounting")
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build the interposer and the fake libcuda")
    out = tmp_path_factory.mktemp("interposer-build")
    interposer = out / "liblinkpack_cuda.so"
    if shutil.which("make"):
        _run(["make", "-s", "interposer", f"INTERPOSER_BUILD={out}", f"CC={cc}"], cwd=REPO)
    else:  # the same command the Makefile runs
        sources = sorted(str(p) for p in INTERPOSER_SRC.glob("*.c"))
        compat = [_library(cc, name) for name in ("libdl.so.2", "libpthread.so.0")]
        _run([cc, *WARNINGS, "-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic-functions",
              "-o", str(interposer), *sources, "-Wl,--no-as-needed", *filter(None, compat),
              "-ldl", "-lpthread"])  # fmt: skip
    assert interposer.is_file()

    fake_dir = out / "fake"
    fake_dir.mkdir()
    fake = fake_dir / "libcuda.so.1"
    _run([cc, *WARNINGS, *INCLUDES, "-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic-functions",
          "-Wl,-soname,libcuda.so.1", "-o", str(fake), str(HERE / "fake_cuda" / "fake_libcuda.c"), "-lpthread"])  # fmt: skip
    (fake_dir / "libcuda.so").symlink_to("libcuda.so.1")

    memprobe, launchprobe, nextprobe = out / "memprobe", out / "launchprobe", out / "nextprobe"
    link = ["-L", str(fake_dir), "-lcuda"]
    _run([cc, *WARNINGS, *INCLUDES, "-o", str(memprobe), str(PROGRAMS / "memprobe.c"), *link, "-ldl"])
    _run([cc, *WARNINGS, *INCLUDES, "-o", str(launchprobe), str(PROGRAMS / "launchprobe.c"), *link])
    rtld = str(PROGRAMS / "rtld_next.c")
    _run([cc, *WARNINGS, "-fPIC", "-shared", "-DPART_B", "-o", str(out / "libnext_b.so"), rtld, "-ldl"])
    _run([cc, *WARNINGS, "-fPIC", "-shared", "-DPART_C", "-o", str(out / "libnext_c.so"), rtld])
    _run([cc, *WARNINGS, "-o", str(nextprobe), rtld, "-L", str(out), "-Wl,--no-as-needed", "-lnext_b",
          "-lnext_c", f"-Wl,-rpath,{out}", "-ldl"])  # fmt: skip
    return Build(interposer, fake_dir, memprobe, launchprobe, nextprobe, PROGRAMS / "cuda_ctypes_probe.py")
