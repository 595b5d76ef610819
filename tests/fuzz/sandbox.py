"""Run a function in a child Python process, under a memory limit and a deadline.

A parser that loops forever, or expands a small input into gigabytes, must fail a fuzz test
instead of hanging it or taking the machine down: the call runs in a child process whose
address space is limited (RLIMIT_AS), and the parent stops waiting after `timeout_s`, kills the
child and starts a fresh one for the next call.

    with Sandbox() as sandbox:
        outcome = sandbox.call("tests.fuzz.topo_support:summarize", text, timeout_s=5)

The child is `python -m tests.fuzz.sandbox`; calls and results travel as length-prefixed pickles
on its stdin and stdout.
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MEMORY_BYTES = 256 << 20
_LENGTH_BYTES = 8


@dataclass(frozen=True)
class Outcome:
    """What one call did: returned `value`, raised (`error_type` etc.), hung or crashed the child."""

    value: Any = None
    error_type: str = ""  # "module.QualName" of the exception raised, "" when it returned
    message: str = ""
    traceback: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)  # e.g. line_no of a parse error
    hung: bool = False
    crashed: str = ""  # why the child process died, "" when it did not
    seconds: float = 0.0


class Sandbox:
    """One child process serving calls one at a time; a context manager."""

    def __init__(self, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> None:
        self.memory_bytes = memory_bytes
        self._proc: subprocess.Popen[bytes] | None = None
        # The child's stderr, quoted when it dies; closed in __exit__.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        self._stderr.close()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        text = self._stderr.read()[-2000:].decode(errors="replace").strip()
        self._stderr.seek(0)
        self._stderr.truncate()
        return f"; its stderr: {text}" if text else ""

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            env = {**os.environ, "LINKPACK_SANDBOX_MEMORY": str(self.memory_bytes)}
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fuzz.sandbox"],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
            )
        return self._proc

    def call(self, target: str, *args: Any, timeout_s: float = 5.0) -> Outcome:
        """Call `target` ("module:function") with `args` in the child; never raises for what it does."""
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        payload = pickle.dumps((target, args))
        started = time.monotonic()
        try:
            proc.stdin.write(len(payload).to_bytes(_LENGTH_BYTES, "big") + payload)
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return Outcome(crashed="the sandbox process had exited", seconds=0.0)
        deadline = started + timeout_s
        fd = proc.stdout.fileno()
        try:
            header = _read_exactly(fd, _LENGTH_BYTES, deadline)
            body = _read_exactly(fd, int.from_bytes(header, "big"), deadline)
        except TimeoutError:
            self.close()
            return Outcome(hung=True, seconds=time.monotonic() - started)
        except EOFError:
            code = proc.wait()
            self.close()
            why = f"the sandbox process exited with code {code}{self._stderr_tail()}"
            return Outcome(crashed=why, seconds=time.monotonic() - started)
        result: dict[str, Any] = pickle.loads(body)
        return Outcome(**result, seconds=time.monotonic() - started)


def _read_exactly(fd: int, count: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    remaining = count
    while remaining:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            raise TimeoutError
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------- the child


def _run(target: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """The fields of an Outcome (plain data: the child runs as __main__, the parent unpickles)."""
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    try:
        return {"value": function(*args)}
    except BaseException as exc:  # the parent judges what escaped; report everything
        kind = type(exc)
        attributes = {name: getattr(exc, name) for name in ("line_no",) if hasattr(exc, name)}
        try:
            text = str(exc)
        except Exception:  # str() of an exception may itself fail (MemoryError and friends)
            text = f"<str() of the {kind.__name__} failed>"
        return {
            "error_type": f"{kind.__module__}.{kind.__qualname__}",
            "message": text[:4000],
            "traceback": "".join(traceback.format_exception(exc))[-8000:],
            "attributes": attributes,
        }


def _serve() -> None:
    import resource

    limit = int(os.environ.get("LINKPACK_SANDBOX_MEMORY", DEFAULT_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    channel_in, channel_out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print in the called code must not corrupt the channel
    while True:
        header = channel_in.read(_LENGTH_BYTES)
        if len(header) < _LENGTH_BYTES:
            return
        target, args = pickle.loads(channel_in.read(int.from_bytes(header, "big")))
        outcome = _run(target, args)
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:
            data = pickle.dumps({"error_type": "pickle", "message": f"result not picklable: {exc}"})
        channel_out.write(len(data).to_bytes(_LENGTH_BYTES, "big") + data)
        channel_out.flush()


if __name__ == "__main__":
    _serve()
