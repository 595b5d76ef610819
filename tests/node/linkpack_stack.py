"""Linkpack on a real node: the extender (mutual TLS), kube-scheduler with the shipped
configuration, and the node agent as a host process in `--simulate dgx-a100` mode whose device
plugin registers with the real kubelet (the fixed device-plugin directory) and reads the
kubelet's pod-resources socket under its root dir. The simulated GPU 7 is in MIG mode, cut into
seven 1g.5gb instances (the A100 40GB's smallest profile, `--simulate-mig`); GPUs 0-6 stay whole.

`LinkpackStack` starts and restarts each piece by pid; `pod_resources()` asks the kubelet
which container holds which device IDs (the account dcgm-exporter reads), and
`visible_devices()` reads what a container printed of its environment.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from contract.allocation import Allocation, decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from node_agent.deviceplugin.reconcile import KubeletAssignment
from node_agent.deviceplugin.server import KubeletPodResources
from tests.cluster.controlplane import REPO_ROOT, ControlPlane, free_port, tail, wait_for
from tests.cluster.linkpack_env import ExtenderProcess, extender_tls, scheduler_config
from tests.cluster.procs import die_with_parent
from tests.node.real_node import DEVICE_PLUGIN_DIR, RealNode
from tests.support.resources import GPU, mig_resource

MACHINE = "dgx-a100"
MIG_GPU = 7
MIG_PROFILE = "1g.5gb"
MIG_INSTANCES = 7
MIG_RESOURCE = mig_resource(MIG_PROFILE)
MIG_LAYOUT = f"{MIG_GPU}={MIG_PROFILE}*{MIG_INSTANCES}"
WHOLE_GPUS = 7  # the machine's 8 GPUs but the MIG one


_RUNS = itertools.count(1)  # numbers the log files of the session's processes


@dataclass
class AgentProcess:
    """`python -m node_agent --simulate <machine> --simulate-mig <layout>` for the real node."""

    node: RealNode
    machine: str = MACHINE
    mig_layout: str = MIG_LAYOUT  # "" starts every GPU whole
    port: int = 0
    runs: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.node.log_dir / f"node-agent-{self.runs}.log"

    def start(self) -> None:
        self.runs = next(_RUNS)
        self.port = free_port()
        base = self.node.base
        argv = [
            sys.executable,
            "-m",
            "node_agent",
            f"--simulate={self.machine}",
            f"--node-name={self.node.node}",
            f"--kubeconfig={self.node.cp.kubeconfig_path}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={self.port}",
            "--poll-interval=0.5",
            "--heartbeat-interval=5",
            f"--device-plugin-dir={DEVICE_PLUGIN_DIR}",
            f"--pod-resources-socket={self.node.pod_resources_socket}",
            f"--shim-host-dir={base / 'shim'}",
            f"--gpu-state-dir={base / 'gpu-state'}",
            "--no-watchdog",
        ]
        if self.mig_layout:
            argv.append(f"--simulate-mig={self.mig_layout}")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=die_with_parent(),
            )

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"node agent exited: {tail(self.log_path)}")
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            return False

        wait_for(healthy, 60, "the node agent's /healthz")

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text


@dataclass
class LinkpackStack:
    node: RealNode
    extender: ExtenderProcess = field(init=False)
    agent: AgentProcess = field(init=False)
    extender_runs: int = 0

    def __post_init__(self) -> None:
        self.agent = AgentProcess(self.node)

    @property
    def cp(self) -> ControlPlane:
        return self.node.cp

    def start(self) -> None:
        self.agent.start()
        self.start_extender()
        self.cp.start_scheduler(scheduler_config(self.cp, self.extender.url, self.extender.tls))
        core = client.CoreV1Api(self.cp.api_client())

        if self.agent.mig_layout:
            want = {GPU: WHOLE_GPUS, MIG_RESOURCE: MIG_INSTANCES}
        else:  # every GPU whole
            want = {GPU: WHOLE_GPUS + 1}

        def advertised() -> bool:
            capacity = core.read_node(self.node.node).status.capacity or {}
            return all(str(capacity.get(name)) == str(count) for name, count in want.items())

        wait_for(advertised, 60, "the kubelet to advertise the plugin's GPUs and MIG instances")

    def start_extender(self, port: int = 0) -> None:
        self.extender_runs = next(_RUNS)
        log = self.cp.log_dir / f"extender-node-{self.extender_runs}.log"
        self.extender = ExtenderProcess(self.cp.kubeconfig_path, log, extender_tls(self.cp), port)
        self.extender.start()

    def restart_extender(self) -> None:
        """Kill the extender and start it again on the same port (the scheduler's config names it)."""
        port = self.extender.port
        self.extender.kill()
        self.start_extender(port)

    def restart_agent(self) -> None:
        self.agent.stop()
        self.agent.start()

    def stop(self) -> None:
        self.cp.stop_scheduler()
        if hasattr(self, "extender"):
            self.extender.kill()
        self.agent.stop()

    # ------------------------------------------------------------------ reading the node

    def pod_resources(self) -> tuple[KubeletAssignment, ...]:
        """The kubelet's own account of our devices, container by container."""
        return KubeletPodResources(str(self.node.pod_resources_socket), lambda r: True).list()


def recorded(pod: Any) -> Allocation | None:
    """The allocation record the extender wrote on the pod (a V1Pod)."""
    text = (pod.metadata.annotations or {}).get(ALLOCATION_ANNOTATION)
    return decode_allocation(text) if text else None


def env_of(log: str) -> dict[str, str]:
    """`KEY=value` lines a container printed with `env`."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum():
            out[key] = value
    return out


@contextlib.contextmanager
def running_stack(node: RealNode) -> Iterator[LinkpackStack]:
    stack = LinkpackStack(node)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def wait_pod_phase(core: Any, namespace: str, name: str, phases: set[str], timeout_s: float) -> Any:
    def reached() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in phases else None

    return wait_for(
        reached,
        timeout_s,
        f"pod {namespace}/{name} in {sorted(phases)}",
        on_timeout=lambda: pod_story(core, namespace, name),
    )


def pod_story(core: Any, namespace: str, name: str) -> str:
    """Where a pod is and why, for a timeout's message: node, phase, conditions and events."""
    try:
        pod = core.read_namespaced_pod(name, namespace)
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    except Exception as exc:  # the message is best effort; the timeout is the failure
        return f"(could not read pod {namespace}/{name}: {exc})"
    conditions = [
        f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip() for c in pod.status.conditions or ()
    ]
    lines = [f"pod {namespace}/{name}: node={pod.spec.node_name} phase={pod.status.phase}", *conditions]
    lines += [f"event {e.reason}: {e.message}" for e in events[-10:]]
    return "\n".join(lines)
