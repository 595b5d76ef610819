"""Linkpack's fractional-GPU shim: hold ML frameworks in this process to the container's GPU share.

Loaded by the `sitecustomize` beside it, which Python imports at start-up because the device
plugin puts this directory on PYTHONPATH for containers given a GPU share. It reads

- `LINKPACK_MEMORY_FRACTION`: per visible GPU, the granted part of its memory (0-1), comma-separated;
- `LINKPACK_MEMORY_LIMIT_MIB`: per visible GPU, the granted memory in MiB, comma-separated;

(a single value applies to every GPU; 0 means no cap) and applies them to whichever
frameworks the program uses, only once they are imported:

- PyTorch: `torch.cuda.set_per_process_memory_fraction(fraction, device)` for every visible
  device, queued to run when CUDA initialises (so importing torch does not initialise CUDA,
  which would break fork-based workers); applied at once if CUDA is already up;
- JAX: the memory fraction variable (`XLA_PYTHON_CLIENT_MEM_FRACTION`, or whichever of it and
  `XLA_CLIENT_MEM_FRACTION` the program set, lowered to the share if higher; never both, which
  newer JAX refuses) and `XLA_PYTHON_CLIENT_PREALLOCATE=false` (unless set), set in the
  environment before JAX can be imported;
- TensorFlow: `TF_FORCE_GPU_ALLOW_GROWTH=true` in the environment, and when tensorflow is
  imported, a logical device with `memory_limit` = the granted MiB on every physical GPU
  (`tf.config.set_logical_device_configuration`). When TensorFlow has already initialised its
  GPUs that call is refused; then only growth-on-demand applies (reported on stderr).

The caps are cooperative: a process may lift them, and each process gets the whole share
(N processes may use N times it). Stronger enforcement is the CUDA interposer, MPS or MIG.

Under the CUDA interposer (node_agent/sharing/interposer, `LD_PRELOAD`ed into the same process) the
frameworks see the cap as each capped device's whole memory (`cuMemGetInfo`,
`cuDeviceTotalMem`), so a fraction of the physical GPU would shrink the share a second time:
while the interposer is loaded and on, the fraction of every capped device is 1 (all of what the
process sees); TensorFlow's limit is in MiB and stays. Without the interposer in the process
(switched off, or `LD_PRELOAD` replaced by the pod) the fractions apply as given.

It never raises into the user's program: failures are reported once on stderr. It imports
nothing from the Linkpack project (it runs inside user containers) and only the standard
library at start-up.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV_FRACTION = "LINKPACK_MEMORY_FRACTION"
ENV_LIMIT_MIB = "LINKPACK_MEMORY_LIMIT_MIB"
INTERPOSER_LIBRARY = "liblinkpack_cuda.so"
_OFF = {"off", "0", "false", "no", "disabled"}  # LINKPACK_INTERPOSER values that switch it off

#: what was applied, by framework, for tests and for a look from inside the container
applied: dict[str, Any] = {}
_reported = False
_lock = threading.Lock()


def report(problem: str) -> None:
    """Say on stderr, once per process, that the shim could not do something."""
    global _reported
    with _lock:
        if _reported:
            return
        _reported = True
    with contextlib.suppress(Exception):
        sys.stderr.write(f"linkpack-shim: {problem}\n")


def per_device(text: str | None, parse: Callable[[str], float]) -> tuple[float, ...]:
    """Comma-separated per-device values; () when absent or malformed."""
    if not text:
        return ()
    try:
        values = tuple(parse(part.strip()) for part in text.split(","))
    except ValueError:
        return ()
    return values if all(v >= 0 for v in values) else ()


def value_for(values: Sequence[float], device: int) -> float:
    if not values:
        return 0.0
    return values[device] if device < len(values) else values[-1] if len(values) == 1 else 0.0


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once a named top-level module has finished importing."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self._callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callback = self._callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _CallbackLoader(spec.loader, callback)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    """Delegates to the real loader, then puts it back and runs the callback."""

    def __init__(self, inner: Any, callback: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._callback = callback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self._inner.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._inner
        module.__loader__ = self._inner
        self._inner.exec_module(module)
        guarded(f"applying the GPU share to {module.__name__}", self._callback, module)


def guarded(what: str, call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except Exception as exc:
        report(f"{what} failed: {type(exc).__name__}: {exc}")


def limit_torch(torch: ModuleType, fractions: Sequence[float]) -> None:
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        return

    def apply() -> None:
        done = {}
        for device in range(cuda.device_count()):
            fraction = value_for(fractions, device)
            if 0 < fraction <= 1:
                cuda.set_per_process_memory_fraction(fraction, device)
                done[device] = fraction
        applied["torch"] = done

    queue = getattr(cuda, "_lazy_call", None)
    if cuda.is_initialized() or queue is None:
        apply()
    else:
        queue(lambda: guarded("limiting torch GPU memory", apply))
        applied["torch"] = "queued until CUDA initialises"


def limit_tensorflow(tf: ModuleType, limits_mib: Sequence[float]) -> None:
    config = tf.config
    configure = getattr(config, "set_logical_device_configuration", None) or getattr(
        config.experimental, "set_virtual_device_configuration", None
    )
    logical = getattr(config, "LogicalDeviceConfiguration", None) or getattr(
        config.experimental, "VirtualDeviceConfiguration", None
    )
    if configure is None or logical is None:
        report("this TensorFlow has no logical device configuration; only memory growth applies")
        return
    done = {}
    for device, gpu in enumerate(config.list_physical_devices("GPU")):
        limit = int(value_for(limits_mib, device))
        if limit > 0:
            configure(gpu, [logical(memory_limit=limit)])
            done[device] = limit
    applied["tensorflow"] = done


def limit_jax_environment(fractions: Sequence[float]) -> None:
    """JAX takes one fraction for every device: the smallest share is the one to respect.

    JAX reads XLA_CLIENT_MEM_FRACTION (newer) or XLA_PYTHON_CLIENT_MEM_FRACTION (older, still
    honoured), and newer JAX refuses to start on the GPU when both are set. So only the one the
    program already set is lowered (both if it set both); otherwise the older name is set.
    """
    capped = [f for f in fractions if f > 0]
    if not capped:
        return
    fraction = min(min(capped), 1.0)
    names = [n for n in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION") if n in os.environ]
    for name in names or ["XLA_PYTHON_CLIENT_MEM_FRACTION"]:
        current = os.environ.get(name)
        try:
            keep = current is not None and 0 < float(current) <= fraction
        except ValueError:
            keep = False
        if not keep:
            os.environ[name] = f"{fraction:.6f}".rstrip("0").rstrip(".")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    applied["jax"] = {n: os.environ[n] for n in names or ["XLA_PYTHON_CLIENT_MEM_FRACTION"]}


def interposer_holds_memory(maps: str = "/proc/self/maps") -> bool:
    """The CUDA interposer is loaded in this process and switched on."""
    if os.environ.get("LINKPACK_INTERPOSER", "").strip().lower() in _OFF:
        return False
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            return any(INTERPOSER_LIBRARY in line for line in f)
    except OSError:
        return False


def rebased(fractions: Sequence[float], limits_mib: Sequence[float]) -> tuple[float, ...]:
    """The fractions as the frameworks must see them under the interposer: 1 for every device the
    interposer caps (its whole visible memory is the cap), the given fraction elsewhere."""
    count = 1 if len(fractions) <= 1 and len(limits_mib) <= 1 else max(len(fractions), len(limits_mib))
    return tuple(
        1.0 if value_for(limits_mib, d) > 0 and value_for(fractions, d) > 0 else value_for(fractions, d)
        for d in range(count)
    )


def activate() -> None:
    """Apply the share from the environment to every framework, now or when it is imported."""
    fractions = per_device(os.environ.get(ENV_FRACTION), float)
    limits_mib = per_device(os.environ.get(ENV_LIMIT_MIB), float)
    if not any(fractions) and not any(limits_mib):
        return
    if any(limits_mib) and interposer_holds_memory():
        fractions = rebased(fractions, limits_mib)
        applied["interposer"] = True
    if any(fractions):
        limit_jax_environment(fractions)
    if any(limits_mib):
        os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"

    hooks: dict[str, Callable[[ModuleType], None]] = {}
    if any(fractions):
        hooks["torch"] = lambda module: limit_torch(module, fractions)
    if any(limits_mib):
        hooks["tensorflow"] = lambda module: limit_tensorflow(module, limits_mib)
    for name, hook in list(hooks.items()):
        module = sys.modules.get(name)
        if module is not None:  # imported before us (unusual): apply at once
            guarded(f"applying the GPU share to {name}", hook, module)
            del hooks[name]
    if hooks:
        sys.meta_path.insert(0, _AfterImport(hooks))
