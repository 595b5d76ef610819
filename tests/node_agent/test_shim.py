"""The framework shim in a child Python, with fake torch / tensorflow / jax modules.

Each test runs `python` with PYTHONPATH = the shim directory (so its sitecustomize runs, as in a
container) plus a directory of fake frameworks, and reads back what the fakes were told.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import node_agent.sharing.shim

SHIM_DIR = Path(node_agent.sharing.shim.__file__).parent

FAKE_TORCH = """
import types
calls = []
queued = []
state = {"initialized": INITIALIZED, "fail": FAIL}

def _set(fraction, device=None):
    if state["fail"]:
        raise RuntimeError("driver says no")
    calls.append((fraction, device))

def _lazy_call(fn):
    queued.append(fn)

def _initialise():
    state["initialized"] = True
    for fn in queued:
        fn()

cuda = types.ModuleType("torch.cuda")
cuda.is_available = lambda: True
cuda.device_count = lambda: 2
cuda.is_initialized = lambda: state["initialized"]
cuda.set_per_process_memory_fraction = _set
if LAZY:  # torch's own private hook, which the shim calls where torch has it: the fake has it too
    cuda._lazy_call = _lazy_call
cuda.initialise_for_test = _initialise
"""

FAKE_TENSORFLOW = """
import types
configured = []

class LogicalDeviceConfiguration:
    def __init__(self, memory_limit=None):
        self.memory_limit = memory_limit

def set_logical_device_configuration(device, logical):
    configured.append((device, [c.memory_limit for c in logical]))

config = types.SimpleNamespace(
    list_physical_devices=lambda kind: ["/physical_device:GPU:0", "/physical_device:GPU:1"] if kind == "GPU" else [],
    set_logical_device_configuration=set_logical_device_configuration,
    LogicalDeviceConfiguration=LogicalDeviceConfiguration,
    experimental=types.SimpleNamespace(),
)
"""


def fakes(tmp_path: Path, *, initialized: bool = False, lazy: bool = True, fail: bool = False) -> Path:
    root = tmp_path / "fakes"
    (root / "torch").mkdir(parents=True, exist_ok=True)
    torch = (
        FAKE_TORCH.replace("INITIALIZED", str(initialized))
        .replace("LAZY", str(lazy))
        .replace("FAIL", str(fail))
    )
    (root / "torch" / "__init__.py").write_text(torch)
    (root / "tensorflow").mkdir(exist_ok=True)
    (root / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
    return root


def run(
    code: str, env: dict[str, str], *paths: Path, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LINKPACK_", "XLA_", "TF_", "PYTHON"))}
    clean["PYTHONPATH"] = os.pathsep.join(str(p) for p in (SHIM_DIR, *paths))
    clean["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the shim directory as it is shipped
    clean.update(env)
    return subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(code)],
        env=clean,
        cwd=paths[0] if paths else SHIM_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )


def result(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


SHARE = {"LINKPACK_MEMORY_FRACTION": "0.25,0.5", "LINKPACK_MEMORY_LIMIT_MIB": "20480,40960"}


def test_torch_gets_the_fraction_per_device_once_cuda_initialises(tmp_path: Path) -> None:
    """PyTorch gets each device's memory fraction once CUDA initialises, not at import."""
    proc = run(
        """
        import json, torch
        before = list(torch.calls)
        torch.cuda.initialise_for_test()
        print(json.dumps({"before": before, "after": torch.calls}))
        """,
        SHARE,
        fakes(tmp_path),
    )
    assert result(proc) == {"before": [], "after": [[0.25, 0], [0.5, 1]]}
    assert proc.stderr == ""


def test_torch_with_cuda_already_up_or_without_a_lazy_queue_is_limited_at_import(tmp_path: Path) -> None:
    """PyTorch with CUDA already up, or without a lazy queue, is limited at import."""
    code = "import json, torch; print(json.dumps(torch.calls))"
    assert result(run(code, SHARE, fakes(tmp_path, initialized=True))) == [[0.25, 0], [0.5, 1]]
    assert result(run(code, SHARE, fakes(tmp_path, lazy=False))) == [[0.25, 0], [0.5, 1]]


def test_torch_already_imported_before_the_shim_is_limited_at_once(tmp_path: Path) -> None:
    # -S: no site, so sitecustomize is not run at start; torch comes first, then the shim
    """PyTorch imported before the shim is limited at once."""
    proc = run(
        """
        import json, sys, torch
        torch.cuda.initialise_for_test()
        import sitecustomize, linkpack_shim
        print(json.dumps({"calls": torch.calls, "applied": {str(k): v for k, v in linkpack_shim.applied["torch"].items()}}))
        """,
        {"LINKPACK_MEMORY_FRACTION": "0.3"},
        fakes(tmp_path),
        flags=("-S",),
    )
    assert result(proc) == {"calls": [[0.3, 0], [0.3, 1]], "applied": {"0": 0.3, "1": 0.3}}


def test_a_failing_framework_call_is_reported_once_and_never_breaks_the_program(tmp_path: Path) -> None:
    """A failing framework call is reported once on stderr and never breaks the program."""
    proc = run(
        """
        import json, torch
        torch.cuda.initialise_for_test()
        print(json.dumps("still running"))
        """,
        SHARE,
        fakes(tmp_path, fail=True),
    )
    assert result(proc) == "still running"
    assert proc.stderr.count("linkpack-shim:") == 1 and "driver says no" in proc.stderr


def test_tensorflow_gets_a_logical_device_with_the_granted_mib_and_memory_growth(tmp_path: Path) -> None:
    """TensorFlow gets a logical device of the granted MiB and memory growth."""
    proc = run(
        """
        import json, os, tensorflow
        print(json.dumps({"configured": tensorflow.configured, "growth": os.environ["TF_FORCE_GPU_ALLOW_GROWTH"]}))
        """,
        SHARE,
        fakes(tmp_path),
    )
    assert result(proc) == {
        "configured": [["/physical_device:GPU:0", [20480]], ["/physical_device:GPU:1", [40960]]],
        "growth": "true",
    }


def test_jax_environment_is_capped_before_jax_can_be_imported(tmp_path: Path) -> None:
    """JAX's memory fraction is capped in the environment before JAX can be imported."""
    code = """
        import json, os
        print(json.dumps({k: os.environ.get(k) for k in (
            "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE")}))
        """
    # only one fraction variable: newer JAX falls back to the CPU when both are set
    assert result(run(code, SHARE)) == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25",
        "XLA_CLIENT_MEM_FRACTION": None,
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }
    own = {**SHARE, "XLA_CLIENT_MEM_FRACTION": "0.9", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    assert result(run(code, own)) == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
        "XLA_CLIENT_MEM_FRACTION": "0.25",  # the program's own variable, lowered to the share
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true",  # preallocating within the fraction is fine
    }
    smaller = {**SHARE, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1"}
    assert result(run(code, smaller))["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"  # asked for less: kept


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"LINKPACK_MEMORY_FRACTION": "half"},
        {"LINKPACK_MEMORY_FRACTION": "0", "LINKPACK_MEMORY_LIMIT_MIB": "0"},
    ],
)
def test_without_a_usable_share_nothing_is_touched(tmp_path: Path, env: dict[str, str]) -> None:
    """Without a usable share in the environment nothing is touched."""
    proc = run(
        """
        import json, os, sys, torch, linkpack_shim
        torch.cuda.initialise_for_test()
        print(json.dumps({"calls": torch.calls, "applied": linkpack_shim.applied,
                          "xla": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
                          "hooks": [type(f).__name__ for f in sys.meta_path if "AfterImport" in type(f).__name__]}))
        """,
        env,
        fakes(tmp_path),
    )
    assert result(proc) == {"calls": [], "applied": {}, "xla": None, "hooks": []}
    assert proc.stderr == ""


def test_absent_frameworks_import_as_absent_and_other_imports_work(tmp_path: Path) -> None:
    """Frameworks that are not installed stay absent, and other imports work as usual."""
    proc = run(
        """
        import json
        try:
            import torch
            found = True
        except ModuleNotFoundError:
            found = False
        import email.mime.text
        print(json.dumps(found))
        """,
        SHARE,
        tmp_path,
    )
    assert result(proc) is False and proc.stderr == ""


def test_the_images_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    """The image's own sitecustomize still runs after ours."""
    own = tmp_path / "image-site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITE_RAN'] = 'yes'\n")
    proc = run("import json, os; print(json.dumps(os.environ.get('IMAGE_SITE_RAN')))", SHARE, own)
    assert result(proc) == "yes"


def test_the_shim_imports_only_the_standard_library() -> None:
    """The shim imports only the standard library at start-up."""
    for source in (SHIM_DIR / "linkpack_shim.py", SHIM_DIR / "sitecustomize.py"):
        tree = ast.parse(source.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
        names -= {"__future__", "linkpack_shim"}
        assert names <= sys.stdlib_module_names, names - sys.stdlib_module_names


@pytest.mark.timeout(10)
def test_under_the_interposer_capped_devices_get_all_of_what_the_process_sees() -> None:
    """Under the interposer a capped device's fraction becomes 1 (its visible memory is the cap); uncapped devices keep theirs."""
    from node_agent.sharing.shim.linkpack_shim import rebased

    assert rebased((0.25, 0.5), (20480.0, 40960.0)) == (1.0, 1.0)
    assert rebased((0.25,), (20480.0,)) == (1.0,)  # one value for every device
    assert rebased((0.25, 0.5), (20480.0, 0.0)) == (1.0, 0.5)
    assert rebased((0.0, 0.5), (20480.0, 40960.0)) == (0.0, 1.0)


@pytest.mark.timeout(10)
def test_the_interposer_counts_only_when_mapped_and_switched_on(tmp_path: Path, monkeypatch) -> None:
    """The shim sees the interposer holding memory only when its library is mapped in the process and not switched off."""
    from node_agent.sharing.shim.linkpack_shim import interposer_holds_memory

    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /opt/linkpack/interposer/liblinkpack_cuda.so\n")
    monkeypatch.delenv("LINKPACK_INTERPOSER", raising=False)
    assert interposer_holds_memory(str(maps))
    monkeypatch.setenv("LINKPACK_INTERPOSER", "off")
    assert not interposer_holds_memory(str(maps))
    monkeypatch.delenv("LINKPACK_INTERPOSER")
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n")
    assert not interposer_holds_memory(str(maps))
    assert not interposer_holds_memory(str(tmp_path / "absent"))
