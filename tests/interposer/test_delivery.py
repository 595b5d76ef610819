"""The interposer as the node delivers it: any CUDA program in a share container held to its share.

The agent's delivery code installs the freshly built library (and the framework shim) into a host
directory, the real gRPC device plugin answers the kubelet's Allocate for a share whose record says
`interposer`, and programs on the fake libcuda are started with exactly the environment and mounts
of that answer, as the container runtime would start them:

- as root with mount namespaces (`unshare`), in a private mount namespace where each mount of the
  answer is bind-mounted at its container path (read-only where it says so), /tmp is a fresh
  tmpfs (the container's own), and the fake driver sits where a runtime would inject it;
- elsewhere, with the answer's container paths rewritten to their host paths (the closest a
  process can come to the mounts without privileges), and the accounting file in a temporary
  directory.

Besides the answer, a program gets only what the image and the NVIDIA runtime would give it: PATH,
the driver on LD_LIBRARY_PATH and LINKPACK_REAL_LIBCUDA naming it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from contract.allocation import ComputePriority, Enforcement
from node_agent import wiring
from node_agent.config import AgentConfig
from node_agent.deviceplugin._generated import deviceplugin_pb2 as api
from node_agent.deviceplugin.broker import AllocationBroker
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.inventory import share_unit_id
from node_agent.deviceplugin.plugin_host import install_shim
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from node_agent.deviceplugin.server import DevicePlugins, PluginConfig, start_device_plugins
from node_agent.loop.agent_loop import Agent
from node_agent.metrics import AgentMetrics
from node_agent.sharing.interposer_delivery import install_interposer, interposer_installed, load_problem
from node_agent.sources.nvml_simulated import SimulatedNvml
from tests.interposer.conftest import Build
from tests.node_agent.fake_kubelet import plugin_stub
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.node_agent.test_shim import fakes
from tests.node_agent.test_shim import run as shim_run
from tests.support.device_plugin import bound_pod, inventory, share, uuid, whole
from tests.support.machines import catalog_machine, topo_text
from tests.support.resources import GPU as WHOLE_GPU
from tests.support.resources import SHARED as SHARED_GPU

MIB = 1 << 20
CAP_MIB = 1024
UNITS_PER_GPU = 10
UNITS = 3  # 30 % of the GPU
QUOTA_TOLERANCE = 0.05  # as in test_interposer.py
PREFIX = "linkpack-interposer:"

DRIVER_DIR = "/opt/nvidia-driver"  # where the runtime would put the (fake) driver, in the namespace
PROGRAMS_DIR = "/opt/linkpack-test-programs"


@dataclass
class Node:
    """A node's delivery: the installed shim and interposer, the GPU state directory and the plugins."""

    plugin_dir: Path
    sharing: SharingConfig
    plugins: DevicePlugins


@pytest.fixture
def node(build: Build, tmp_path: Path) -> Iterator[Node]:
    shim = install_shim(tmp_path / "host" / "shim")
    interposer = install_interposer(build.interposer, shim)
    state = tmp_path / "host" / "gpu-state"
    state.mkdir()
    sharing = SharingConfig(
        shim_host_dir=str(shim), interposer_host_dir=str(interposer), gpu_state_dir=str(state)
    )
    store = InMemoryPodRecords(
        [
            bound_pod(
                "held",
                share(1, CAP_MIB, UNITS),
                bound_at=1,
                enforcement=Enforcement.INTERPOSER,
                priority=ComputePriority.HIGH,
            ),
            bound_pod("pair", whole(2, 3), bound_at=2),
        ]
    )
    plugin_dir = Path(tempfile.mkdtemp(prefix="lp-dl-", dir="/tmp"))  # socket paths must stay short
    broker = AllocationBroker(inventory(4, units_per_gpu=UNITS_PER_GPU), store, sharing)
    config = PluginConfig(plugin_dir=str(plugin_dir), pod_resources_socket=None, poll_interval_s=0.05)
    plugins = start_device_plugins(broker, config)
    try:
        yield Node(plugin_dir, sharing, plugins)
    finally:
        plugins.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def allocate(node: Node, resource: str, ids: list[str]) -> api.ContainerAllocateResponse:
    channel, client = plugin_stub(node.plugin_dir, resource)
    with channel:
        answer = client.Allocate(
            api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=ids)]), timeout=5
        )
    return answer.container_responses[0]


def share_answer(node: Node) -> api.ContainerAllocateResponse:
    return allocate(node, SHARED_GPU, [share_unit_id(uuid(1), k) for k in range(UNITS)])


def _namespaces_work() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", "mount --make-rprivate / && mount -t tmpfs none /mnt"],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return done.returncode == 0


NAMESPACES = _namespaces_work()

#: how a test's programs are started: in a mount namespace (when possible) and with mapped paths
MODES = pytest.mark.parametrize("in_namespace", [True, False], ids=["mount-namespace", "path-mapped"])


class Container:
    """Starts programs as a container given `answer` would run them (see the module docstring)."""

    def __init__(
        self, answer: api.ContainerAllocateResponse, build: Build, tmp: Path, in_namespace: bool = NAMESPACES
    ) -> None:
        if in_namespace and not NAMESPACES:
            pytest.skip("mount namespaces need root and unshare(1)")
        self.in_namespace = in_namespace
        self.envs = dict(answer.envs)
        self.mounts = [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]
        self.build = build
        self.tmp = tmp

    def run(
        self, argv: Sequence[str], stdin: str = "", timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        if self.in_namespace:
            return self._in_namespace(argv, stdin, timeout)
        return self._path_mapped(argv, stdin, timeout)

    def program(self, name: str) -> str:
        """Where a built test program is, as the container sees it."""
        return f"{PROGRAMS_DIR}/{name}" if self.in_namespace else str(self.build.memprobe.parent / name)

    def _runtime_env(self, driver_dir: str) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LD_LIBRARY_PATH": driver_dir,
            "LINKPACK_REAL_LIBCUDA": f"{driver_dir}/libcuda.so.1",
        }

    def _in_namespace(
        self, argv: Sequence[str], stdin: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        binds = [
            *self.mounts,
            (DRIVER_DIR, str(self.build.fake_dir), True),
            (PROGRAMS_DIR, str(self.build.memprobe.parent), True),
        ]
        tops = sorted({"/" + path.strip("/").split("/")[0] for path, _, _ in binds})
        lines = ["set -e", "mount --make-rprivate /"]
        # an empty tmpfs over each top directory the mounts go under keeps the host's files out of
        # the new paths (and leaves the host's own directories untouched)
        lines += [f"mount -t tmpfs tmpfs {shlex.quote(top)}" for top in tops if top not in ("/tmp",)]
        for target, source, read_only in binds:
            lines.append(f"mkdir -p {shlex.quote(target)}")
            lines.append(f"mount --bind {shlex.quote(source)} {shlex.quote(target)}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
        lines.append("mount -t tmpfs tmpfs /tmp")  # the container's own /tmp (the accounting file)
        env = {**self.envs, **self._runtime_env(DRIVER_DIR)}
        command = " ".join(
            shlex.quote(a) for a in ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        )
        lines.append(f"exec {command}")
        return subprocess.run(
            ["unshare", "--mount", "sh", "-c", "\n".join(lines)],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _path_mapped(
        self, argv: Sequence[str], stdin: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        env = {}
        for key, value in self.envs.items():
            for target, source, _ in self.mounts:
                value = value.replace(target, source)
            env[key] = value
        env.update(self._runtime_env(str(self.build.fake_dir)))
        env["LINKPACK_ACCOUNTING_FILE"] = str(self.tmp / "accounting")  # a container's own /tmp
        return subprocess.run(
            list(argv), input=stdin, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )


@pytest.mark.timeout(30)
def test_the_installed_library_loads_and_is_found_where_the_plugin_mounts_it(
    build: Build, node: Node
) -> None:
    """The library the agent installed loads (the agent's own check) and is where the plugin's mount takes it from."""
    assert node.sharing.interposer_host_dir is not None
    assert interposer_installed(node.sharing.interposer_host_dir)
    assert load_problem(Path(node.sharing.interposer_host_dir) / "liblinkpack_cuda.so") == ""
    broken = Path(node.sharing.interposer_host_dir).parent / "not-a-library.so"
    broken.write_bytes(b"not an ELF file")
    assert load_problem(broken) != ""


@pytest.mark.timeout(60)
@MODES
def test_a_c_program_in_a_share_container_is_held_to_its_memory_cap(
    build: Build, node: Node, tmp_path: Path, in_namespace: bool
) -> None:
    """A C CUDA program started with exactly the plugin's answer sees its cap as the device's memory and is refused past it, on every path."""
    container = Container(share_answer(node), build, tmp_path, in_namespace)
    script = "\n".join(
        [
            "init",
            "info",
            "total",
            f"alloc mem {512 * MIB} direct",
            f"alloc vmm {256 * MIB} dlsym",
            f"alloc async {256 * MIB} proc",
            "calls",
            "alloc mem 1 direct",
            "alloc managed 1 proc",
            "calls",
            "info",
            "free 0",
            "info proc",
            "quit",
        ]
    )
    done = container.run([container.program("memprobe")], stdin=script + "\n")
    assert done.returncode == 0, done.stdout + done.stderr
    answers = done.stdout.splitlines()
    cap = CAP_MIB * MIB
    assert answers[0] == "ok"
    assert answers[1] == f"info {cap} {cap}" and answers[2] == f"total {cap}"
    assert answers[3:6] == ["ok 0", "ok 1", "ok 2"]
    assert answers[7:9] == ["err 2", "err 2"], (
        "past the cap the driver's OUT_OF_MEMORY comes from the interposer"
    )
    assert answers[6] == answers[9], "the refused allocations never reached the driver"
    assert answers[10] == f"info 0 {cap}"
    assert answers[11:13] == ["ok", f"info {512 * MIB} {cap}"]
    assert PREFIX not in done.stderr, done.stderr


@pytest.mark.timeout(60)
@MODES
def test_a_python_program_in_a_share_container_is_held_to_its_memory_cap(
    build: Build, node: Node, tmp_path: Path, in_namespace: bool
) -> None:
    """A Python program using libcuda through ctypes, started with the plugin's answer (framework shim included), is held to the cap both ways."""
    container = Container(share_answer(node), build, tmp_path, in_namespace)
    # The probe needs only the standard library: run it with the base interpreter, from the
    # programs directory the container sees (a checkout or virtualenv under /tmp or /opt would
    # be hidden by the container's own /tmp and the mounts' directories).
    interpreter = os.path.realpath(sys.executable)
    if in_namespace and interpreter.startswith(("/tmp/", "/opt/", "/run/")):
        pytest.skip(f"the interpreter {interpreter} lies where the container's mounts would hide it")
    shutil.copy(build.ctypes_probe, build.memprobe.parent / build.ctypes_probe.name)
    done = container.run([interpreter, container.program(build.ctypes_probe.name), str(CAP_MIB)])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    cap = CAP_MIB * MIB
    assert out["direct_is_wrapper"] and out["proc_is_wrapper"]
    assert out["past_cap_direct"] == 2 and out["past_cap_proc"] == 2
    assert out["info_full_direct"] == [0, 0, cap] and out["info_empty"] == [0, cap, cap]
    assert PREFIX not in done.stderr and "linkpack-shim:" not in done.stderr


@pytest.mark.timeout(60)
def test_a_share_container_gets_its_compute_share_and_stamps_the_shared_gpu_state(
    build: Build, node: Node, tmp_path: Path
) -> None:
    """A program launching flat out under the plugin's answer gets its 30 % of the GPU's time, and its high priority shows in the node's shared GPU state directory."""
    container = Container(share_answer(node), build, tmp_path)
    done = container.run([container.program("launchprobe"), "3", "2000"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    t0, t1, launches = int(lines[0][1]), int(lines[-1][1]), int(lines[-1][2])
    busy = launches * 2000 * 1000 / (t1 - t0)
    assert busy == pytest.approx(UNITS / UNITS_PER_GPU, abs=QUOTA_TOLERANCE)
    assert node.sharing.gpu_state_dir is not None
    assert [p.name for p in Path(node.sharing.gpu_state_dir).iterdir()], "no per-GPU state file was written"
    assert PREFIX not in done.stderr, done.stderr


@pytest.mark.timeout(60)
def test_a_whole_gpu_container_runs_without_the_interposer(build: Build, node: Node, tmp_path: Path) -> None:
    """A whole-GPU container started with the plugin's answer has no interposer: it sees the device's full memory."""
    container = Container(allocate(node, WHOLE_GPU, [uuid(2), uuid(3)]), build, tmp_path)
    assert "LD_PRELOAD" not in container.envs and container.mounts == []
    done = container.run([container.program("memprobe")], stdin="init\ninfo\nsym cuMemAlloc_v2\nquit\n")
    assert done.returncode == 0, done.stderr
    answers = done.stdout.splitlines()
    assert answers[1] == f"info {80 * 1024 * MIB} {80 * 1024 * MIB}"  # the fake's whole 80 GiB device
    assert answers[2] == "sym real"


def simulated_agent(config: AgentConfig, cluster: FakeNodeApi) -> Agent:
    text = topo_text("hgx-h100")
    return Agent(
        config,
        SimulatedNvml(catalog_machine("hgx-h100"), node_name="n1"),
        cluster,
        AgentMetrics(),
        lambda: text,
        FakeClock(),
    )


@pytest.mark.timeout(60)
def test_the_node_publishes_interposer_available_only_while_the_installed_library_is_in_place(
    build: Build, tmp_path: Path
) -> None:
    """The agent installs the library beside the shim, publishes interposer.available once its plugins serve, and stops saying so when the file goes."""
    plugin_dir = Path(tempfile.mkdtemp(prefix="lp-dl-", dir="/tmp"))
    shim, state = tmp_path / "shim", tmp_path / "gpu-state"
    config = AgentConfig(
        node_name="n1",
        proc_root=tmp_path,
        device_plugin_dir=str(plugin_dir),
        pod_resources_socket=None,
        shim_host_dir=str(shim),
        interposer_lib=str(build.interposer),
        gpu_state_dir=str(state),
    )
    cluster = FakeNodeApi()
    agent = simulated_agent(config, cluster)
    agent.poll()
    assert cluster.status["interposer"] == {"available": False}  # not before it is delivered
    stop = wiring.start_device_plugins(config, agent, cluster)
    assert stop is not None
    try:
        installed = shim / "interposer" / "liblinkpack_cuda.so"
        assert installed.read_bytes() == build.interposer.read_bytes()
        assert stat.S_IMODE(state.stat().st_mode) == 0o1777
        agent.poll()
        assert cluster.status["interposer"] == {"available": True}
        installed.unlink()
        agent.poll()
        assert cluster.status["interposer"] == {"available": False}
    finally:
        stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


@pytest.mark.timeout(60)
def test_a_library_that_does_not_load_or_is_missing_is_not_published(build: Build, tmp_path: Path) -> None:
    """A library that is missing or does not load is not installed for containers, and the node never says the interposer is available."""
    broken = tmp_path / "broken.so"
    broken.write_bytes(b"\x7fELF but not really")
    for source in (broken, tmp_path / "absent.so"):
        plugin_dir = Path(tempfile.mkdtemp(prefix="lp-dl-", dir="/tmp"))
        config = AgentConfig(
            node_name="n1",
            proc_root=tmp_path,
            device_plugin_dir=str(plugin_dir),
            pod_resources_socket=None,
            shim_host_dir=str(tmp_path / f"shim-{source.stem}"),
            interposer_lib=str(source),
            gpu_state_dir=str(tmp_path / "gpu-state"),
        )
        cluster = FakeNodeApi()
        agent = simulated_agent(config, cluster)
        stop = wiring.start_device_plugins(config, agent, cluster)
        assert stop is not None
        try:
            agent.poll()
            assert cluster.status["interposer"] == {"available": False}, source
        finally:
            stop()
            shutil.rmtree(plugin_dir, ignore_errors=True)
    assert not (tmp_path / "gpu-state").exists()  # no state directory for an interposer not delivered


@pytest.mark.timeout(60)
def test_the_framework_shim_does_not_shrink_an_interposer_share_twice(build: Build, tmp_path: Path) -> None:
    """Under the preloaded interposer the framework shim gives PyTorch all of the capped memory it sees (fraction 1), and the physical fraction once the interposer is switched off."""
    code = "import json, torch; torch.cuda.initialise_for_test(); print(json.dumps(torch.calls))"
    share_env = {
        "LINKPACK_MEMORY_FRACTION": "0.25",
        "LINKPACK_MEMORY_LIMIT_MIB": "20480",
        "LD_PRELOAD": str(build.interposer),
    }
    held = shim_run(code, share_env, fakes(tmp_path))
    assert held.returncode == 0, held.stderr
    assert json.loads(held.stdout) == [[1.0, 0], [1.0, 1]]
    off = shim_run(code, {**share_env, "LINKPACK_INTERPOSER": "off"}, fakes(tmp_path))
    assert json.loads(off.stdout) == [[0.25, 0], [0.25, 1]]
