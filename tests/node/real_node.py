"""A real node for tests: containerd + runc + the kubelet of the pinned release, on loopback.

`RealNode` runs, all under one temp dir (short, under /tmp: unix socket paths are limited):
- containerd with its own root, state and socket (`containerd_config`), CRI settings this
  sandboxed class of machine needs (`restrict_oom_score_adj`, a locally built `sandbox_image`,
  no CNI: pods use `hostNetwork` and tolerate the not-ready taint);
- the images of `tests.node.images`, imported with `ctr -n k8s.io images import`
  (`import_image` takes any OCI archive, e.g. one built by `make image`);
- the kubelet (`kubelet_config`) registering as `node` with the control plane's kubeconfig,
  `--root-dir` under the temp dir (pods, checkpoints, the pod-resources socket).

The kubelet always serves device plugins at the fixed `/var/lib/kubelet/device-plugins`, so
only one kubelet can run on a machine: `node_lock` (a file lock beside that directory) is held
for the node's life, and the directory's sockets and checkpoint are removed before and after.
Everything is started and stopped by pid; containers left behind are killed through `ctr`.

Needs root (runc, mounts), cgroups, and Debian's containerd, runc and busybox-static.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.cluster.controlplane import ControlPlane, _Process, free_port, tail, wait_for
from tests.node.images import PAUSE_IMAGE, build_test_images

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
NODE_LOCK = Path("/var/lib/kubelet/linkpack-test-node.lock")
POD_LOGS = Path("/var/log/pods")
#: The test node's name (and its `kubernetes.io/hostname` label); one per machine.
NODE_NAME = "real-node"
NOT_READY_TOLERATION = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}


class RealNodeError(RuntimeError):
    """The node could not be started; the message carries the log tail."""


_HELD_HERE = threading.local()


@contextlib.contextmanager
def node_lock(timeout_s: float = 600.0) -> Iterator[None]:
    """Hold the machine's one kubelet slot (the fixed device-plugin directory) against other
    processes; re-entrant within a thread (whoever holds it here decides who uses the slot)."""
    if getattr(_HELD_HERE, "depth", 0):
        _HELD_HERE.depth += 1
        try:
            yield
        finally:
            _HELD_HERE.depth -= 1
        return
    NODE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with NODE_LOCK.open("a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RealNodeError(f"another test process holds {NODE_LOCK}") from None
                time.sleep(1)
        _HELD_HERE.depth = 1
        try:
            yield
        finally:
            _HELD_HERE.depth = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


def clean_device_plugin_dir() -> None:
    """Remove what a kubelet and its plugins leave in the fixed directory (sockets, checkpoint)."""
    if not DEVICE_PLUGIN_DIR.is_dir():
        return
    for entry in DEVICE_PLUGIN_DIR.iterdir():
        if entry.is_socket() or entry.name == "kubelet_internal_checkpoint":
            entry.unlink(missing_ok=True)


NODE_DIR_PREFIX = "/tmp/lp-node-"


def _stale(pid: int) -> bool:
    """Whether process `pid` belongs to a test node's directory: its command line names one
    (kubelet, containerd, shims, the node agent) or its root is a container's root filesystem."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        root = os.readlink(f"/proc/{pid}/root")
    except OSError:
        return False
    return NODE_DIR_PREFIX.encode() in cmdline or root.startswith(NODE_DIR_PREFIX)


def sweep_stale_nodes() -> list[int]:
    """Kill what an earlier, killed test run left of its node and remove its directories.

    Processes a test restarts from a worker thread cannot be tied to the test process's life
    (the kernel's parent-death signal follows the starting thread), and containers never are;
    with the machine's one node slot held (`node_lock`), every process of a node directory is a
    leftover. Returns the pids killed."""
    ours = {os.getpid(), os.getppid()}
    killed = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in ours and _stale(int(entry.name)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    with contextlib.suppress(OSError):
        for mount in sorted(_mounts_under(NODE_DIR_PREFIX), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
    for leftover in Path("/tmp").glob(Path(NODE_DIR_PREFIX).name + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return killed


def _mounts_under(prefix: str) -> list[str]:
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [m.split()[1] for m in lines if len(m.split()) > 1 and m.split()[1].startswith(prefix)]


def containerd_config(base: Path, sandbox_image: str = PAUSE_IMAGE) -> str:
    return f"""version = 2
root = "{base}/containerd/root"
state = "{base}/containerd/state"
[grpc]
  address = "{base}/containerd.sock"
[ttrpc]
  address = "{base}/containerd.sock.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{base}/cni/bin"
    conf_dir = "{base}/cni/net.d"
"""


def kubelet_config(base: Path, port: int, healthz_port: int) -> dict[str, Any]:
    """The KubeletConfiguration for a test node on a cgroup v1, shared, busy machine."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{base}/containerd.sock",
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "resolvConf": "/etc/resolv.conf",
    }


class RealNode:
    """containerd + kubelet for one node of `cp`; `start()`, `stop()`, `restart_kubelet()`."""

    def __init__(self, cp: ControlPlane, kubelet: Path, node: str = NODE_NAME) -> None:
        self.cp = cp
        self.kubelet_binary = kubelet
        self.node = node
        self.base = Path()
        self._containerd: _Process | None = None
        self._kubelet: _Process | None = None
        self._lock: contextlib.ExitStack | None = None
        self._kubelet_runs = 0
        self.port = 0
        self.healthz_port = 0

    # ------------------------------------------------------------------ paths

    @property
    def root_dir(self) -> Path:
        return self.base / "kubelet"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def log_dir(self) -> Path:
        return self.cp.log_dir

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        lock = contextlib.ExitStack()
        lock.enter_context(node_lock())
        self._lock = lock
        try:
            sweep_stale_nodes()
            self.base = Path(tempfile.mkdtemp(prefix=Path(NODE_DIR_PREFIX).name, dir="/tmp"))
            for sub in ("containerd", "cni/bin", "cni/net.d", "kubelet", "images"):
                (self.base / sub).mkdir(parents=True, exist_ok=True)
            clean_device_plugin_dir()
            self._start_containerd()
            for archive in build_test_images(self.base / "images"):
                self.import_image(archive)
            self.port, self.healthz_port = free_port(), free_port()
            (self.base / "kubelet.json").write_text(
                json.dumps(kubelet_config(self.base, self.port, self.healthz_port), indent=1)
            )
            self.start_kubelet()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self.stop_kubelet()
            self._kill_containers()
            if self._containerd is not None:
                self._containerd.stop()
                self._containerd = None
            clean_device_plugin_dir()
            self._unmount_all()
            if self.base != Path() and not os.environ.get("LINKPACK_KEEP_CLUSTER_DIR"):
                shutil.rmtree(self.base, ignore_errors=True)
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def _start_containerd(self) -> None:
        config = self.base / "containerd.toml"
        config.write_text(containerd_config(self.base))
        self._containerd = _Process(
            "containerd", ["containerd", "--config", str(config)], self.log_dir / "containerd.log"
        )
        wait_for(
            lambda: (
                self._containerd is not None
                and (self._containerd.check_alive() or True)
                and self._ctr("version").returncode == 0
            ),
            30,
            "containerd",
            on_timeout=lambda: tail(self.log_dir / "containerd.log"),
        )

    def _ctr(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)

    def import_image(self, archive: Path) -> None:
        """Import an OCI (or docker-save) image archive into containerd's k8s.io namespace."""
        result = self._ctr("images", "import", "--all-platforms", str(archive))
        if result.returncode != 0:
            raise RealNodeError(f"ctr images import {archive} failed: {result.stderr[-2000:]}")

    def start_kubelet(self) -> None:
        self._kubelet_runs += 1
        argv = [
            str(self.kubelet_binary),
            f"--config={self.base / 'kubelet.json'}",
            f"--kubeconfig={self.cp.kubeconfig_path}",
            f"--root-dir={self.root_dir}",
            f"--hostname-override={self.node}",
            "--v=2",
        ]
        log = self.log_dir / f"kubelet-{self._kubelet_runs}.log"
        self._kubelet = _Process("kubelet", argv, log)
        api = client.CoreV1Api(self.cp.api_client())

        def registered() -> bool:
            assert self._kubelet is not None
            self._kubelet.check_alive()
            return bool(self.pod_resources_socket.exists() and api.read_node(self.node))

        wait_for(registered, 60, f"the kubelet to register {self.node}", on_timeout=lambda: tail(log))

    def stop_kubelet(self) -> None:
        if self._kubelet is not None:
            self._kubelet.stop()
            self._kubelet = None

    def restart_kubelet(self) -> None:
        """Stop the kubelet by pid and start it again with the same flags (pods keep running)."""
        self.stop_kubelet()
        self.start_kubelet()

    def kubelet_log(self) -> str:
        return tail(self.log_dir / f"kubelet-{self._kubelet_runs}.log", 80)

    # ------------------------------------------------------------------ reading the node

    def container_log(self, namespace: str, pod: str, uid: str, container: str) -> str:
        """What the container printed (CRI log lines `<time> <stream> <tag> <text>`, text only)."""
        path = POD_LOGS / f"{namespace}_{pod}_{uid}" / container / "0.log"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line.split(" ", 3)[3] if line.count(" ") >= 3 else "" for line in lines)

    # ------------------------------------------------------------------ cleanup

    def _kill_containers(self) -> None:
        if self._containerd is None or not self._containerd.alive():
            return
        listed = self._ctr("tasks", "ls", "-q")
        for task in listed.stdout.split():
            self._ctr("tasks", "kill", "-s", "SIGKILL", task, timeout_s=20)
        deadline = time.monotonic() + 20
        for task in listed.stdout.split():
            while time.monotonic() < deadline and self._ctr("tasks", "delete", task).returncode != 0:
                time.sleep(0.2)
        for container in self._ctr("containers", "ls", "-q").stdout.split():
            self._ctr("containers", "delete", container)

    def _unmount_all(self) -> None:
        if self.base == Path():
            return
        try:
            targets = _mounts_under(str(self.base))
        except OSError:
            return
        for target in sorted(targets, key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True)


def host_pod(
    name: str,
    command: str,
    *,
    limits: dict[str, str] | None = None,
    image: str = "linkpack.local/busybox:1",
    scheduler: str | None = "linkpack",
    grace_s: int = 2,
    node: str = NODE_NAME,
) -> dict[str, Any]:
    """A hostNetwork pod running `sh -c command` that tolerates the not-ready node (no CNI) and
    selects `node`: the session's control plane may also hold API-only nodes of other tests,
    which no kubelet runs."""
    resources = {"limits": dict(limits), "requests": dict(limits)} if limits else {}
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "tolerations": [NOT_READY_TOLERATION],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_s,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [
            {
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", command],
                "resources": resources,
            }
        ],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def stop_signal_safe(command: str) -> str:
    """`command` under a shell that exits on SIGTERM at once (PID 1 ignores it otherwise)."""
    return f"trap 'exit 0' TERM; {command}"
