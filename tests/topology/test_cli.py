"""`python -m topology parse`: JSON on stdout for good input, `error: line N: ...` and exit 2 otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from topology.catalog import topo_dir
from topology.codec import decode_topology

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topology", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_parse_dgx_a100_prints_decodable_json() -> None:
    """Parsing the DGX A100 capture with a model prints codec JSON (indent 2) that decodes to 8 GPUs."""
    path = topo_dir() / "dgx-a100-40gb-8gpu-10nic-8numa.txt"
    done = run_cli("parse", str(path), "--model", "A100-SXM4-40GB", "--memory-mib", "40960")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('{\n  "schemaVersion"')
    topo = decode_topology(json.loads(done.stdout))
    assert topo.gpu_count == 8 and topo.gpus[0].memory_mib == 40960
    assert done.stderr == ""


def test_parse_recoverable_damage_warns_on_stderr_and_succeeds() -> None:
    """The B300 capture with escape-code remnants parses (exit 0) and the repair is reported on stderr."""
    done = run_cli("parse", str(topo_dir() / "hgx-b300-8gpu-9nic-ansi.txt"))
    assert done.returncode == 0
    assert "warning: removed terminal escape codes" in done.stderr
    assert json.loads(done.stdout)["warnings"]


def test_parse_damaged_file_exits_2_with_the_line(tmp_path: Path) -> None:
    """An asymmetric matrix exits 2 with `error: line 3: asymmetric matrix ...` and nothing on stdout."""
    bad = tmp_path / "asymmetric.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV2\t X \n")
    done = run_cli("parse", str(bad))
    assert done.returncode == 2
    assert done.stderr.startswith("error: line 3: asymmetric matrix")
    assert done.stdout == ""


def test_parse_binary_file_exits_2(tmp_path: Path) -> None:
    """A binary file is rejected as such, exit 2."""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)))
    done = run_cli("parse", str(junk))
    assert done.returncode == 2
    assert "binary data" in done.stderr


def test_parse_missing_file_exits_2(tmp_path: Path) -> None:
    """A file that does not exist gives a clear `cannot read` error, exit 2."""
    done = run_cli("parse", str(tmp_path / "nope.txt"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot read") and "No such file" in done.stderr


def test_parse_dash_reads_standard_input_like_a_file() -> None:
    """`parse -` reads the matrix from standard input and prints what `parse FILE` prints."""
    path = topo_dir() / "hgx-h100-8gpu-no-nic.txt"
    from_stdin = subprocess.run(
        [sys.executable, "-m", "topology", "parse", "-"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == run_cli("parse", str(path)).stdout


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback() -> None:
    """`parse FILE | head`: the reader is gone before the JSON is written; the command ends with
    the SIGPIPE status and nothing on stderr."""
    with subprocess.Popen(
        [sys.executable, "-m", "topology", "parse", str(topo_dir() / "dgx-a100-40gb-8gpu-10nic-8numa.txt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141
    assert err == b""
