"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and (on demand) kube-scheduler.

    with ControlPlane(ensure_binaries()) as cp:
        core = kubernetes.client.CoreV1Api(cp.api_client())
        cp.create_fake_node("gpu-1", {"nvidia.com/gpu": "8"})
        cp.start_scheduler(render_scheduler_config(extender_url, cp.kubeconfig_path))

Everything runs on 127.0.0.1 with free ports chosen at start, in a temporary directory holding
the certificates, tokens, kubeconfig and one log file per process. No kubelet or
controller-manager runs: nodes are API objects only (`create_fake_node`), bound pods stay
Pending, and the ServiceAccount admission plugin is off (nothing would create `default`
service accounts). Every process is started in its own session, is sent SIGTERM (then
SIGKILL) by pid at exit, and is killed by the kernel if the test process dies first.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, ResourceNotFoundError

from tests.cluster.binaries import Binaries
from tests.cluster.procs import die_with_parent
from tests.support.nodes import node_object
from tests.tls_certs import TlsSet

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "manifests"
SCHEDULER_CONFIG = MANIFESTS / "scheduler-config.yaml"
# Placeholders in manifests/scheduler-config.yaml that a test replaces textually.
EXTENDER_URL_PLACEHOLDER = "https://linkpack-extender.linkpack-system.svc:8888"
#: the scheduler's client certificate, key and the CA it checks the extender's certificate with
TLS_PLACEHOLDERS = (
    "/etc/linkpack/client/tls.crt",
    "/etc/linkpack/client/tls.key",
    "/etc/linkpack/client/ca.crt",
)
SERVER_NAME_PLACEHOLDER = "serverName: linkpack-extender.linkpack-system.svc"
KUBECONFIG_PLACEHOLDER = "/etc/kubernetes/scheduler.conf"

ADMIN_USER = "linkpack-test-admin"
# The API server's certificate is self-signed; clients skip verification on loopback.
urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
_START_TIMEOUT_S = 120.0
_STOP_GRACE_S = 10.0
_LOG_TAIL_LINES = 40
_ETCD_DIR_PREFIX = "linkpack-etcd-"
_OWNER_FILE = "owner.pid"

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """The control plane could not start or a process died; the message carries its log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sweep_dead_etcd_dirs(base: Path) -> None:
    """Remove etcd directories left by test processes that were killed (no teardown ran)."""
    for directory in base.glob(f"{_ETCD_DIR_PREFIX}*"):
        try:
            owner = int((directory / _OWNER_FILE).read_text())
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):
            continue  # not ours to judge (another user's, or being created)


def tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"<no log at {path}>"
    return "\n".join(text.splitlines()[-lines:])


def wait_for(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll `condition` until it returns a truthy value; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # a condition may fail transiently while things start
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}{detail}{extra}")
        time.sleep(interval_s)


class _Process:
    """One child process with its log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: Mapping[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise ControlPlaneError(
                f"{self.name} (pid {self.pid}) exited with code {self.popen.returncode}; "
                f"log {self.log_path}:\n{tail(self.log_path)}"
            )

    def stop(self, grace_s: float = _STOP_GRACE_S) -> None:
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(grace_s)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(grace_s)
        finally:
            self._log.close()


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler on demand) on loopback; a context manager."""

    def __init__(
        self,
        binaries: Binaries,
        workdir: Path | None = None,
        keep_workdir: bool | None = None,
        extra_apiserver_args: Iterable[str] = (),
    ) -> None:
        self.binaries = binaries
        self._given_workdir = workdir
        self._keep = (
            keep_workdir if keep_workdir is not None else bool(os.environ.get("LINKPACK_KEEP_CLUSTER_DIR"))
        )
        self._extra_apiserver_args = list(extra_apiserver_args)
        self.workdir = Path()
        self.token = secrets.token_hex(24)
        self.etcd_port = 0
        self.apiserver_port = 0
        self._etcd_data: Path | None = None
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._scheduler: _Process | None = None
        self._scheduler_runs = 0
        self._failed = False

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            self._failed = True
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def start(self) -> None:
        if self._given_workdir is not None:
            self.workdir = self._given_workdir
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="linkpack-cp-"))
        self.log_dir.mkdir(exist_ok=True)
        self._start_etcd()
        self._write_credentials()
        self._start_apiserver()
        self._write_kubeconfig()
        self._wait_for_namespaces()

    def stop(self) -> None:
        """Stop every process (scheduler, apiserver, etcd) by pid; idempotent."""
        errors: list[str] = []
        for attr in ("_scheduler", "_apiserver", "_etcd"):
            process: _Process | None = getattr(self, attr)
            if process is None:
                continue
            try:
                process.stop()
            except Exception as exc:
                errors.append(f"{process.name}: {exc}")
            setattr(self, attr, None)
        if self._failed:
            self.print_log_tails()
        if self._etcd_data is not None:
            shutil.rmtree(self._etcd_data, ignore_errors=True)
            self._etcd_data = None
        if self.workdir != Path() and self._given_workdir is None:
            if self._keep or self._failed:
                print(f"[linkpack cluster] kept control-plane files in {self.workdir}", file=sys.stderr)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
        self._failed = False  # reported once; a second stop() is a no-op
        if errors:
            raise ControlPlaneError("could not stop: " + "; ".join(errors))

    def mark_failed(self) -> None:
        """Keep the work directory and print log tails at stop (call when a test using it failed)."""
        self._failed = True

    def pids(self) -> dict[str, int]:
        procs = {"etcd": self._etcd, "kube-apiserver": self._apiserver, "kube-scheduler": self._scheduler}
        return {name: p.pid for name, p in procs.items() if p is not None and p.alive()}

    def log_tails(self, lines: int = _LOG_TAIL_LINES) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"----- {path.name} (last {lines} lines) -----\n{tail(path, lines)}")
        return "\n".join(parts)

    def print_log_tails(self, lines: int = _LOG_TAIL_LINES) -> None:
        print(self.log_tails(lines), file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ etcd and apiserver

    def _start_etcd(self) -> None:
        self.etcd_port, peer_port = free_port(), free_port()
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.workdir
        _sweep_dead_etcd_dirs(base)
        # On tmpfs fsync is free, which makes the API server's writes fast.
        self._etcd_data = Path(tempfile.mkdtemp(prefix=_ETCD_DIR_PREFIX, dir=base))
        (self._etcd_data / _OWNER_FILE).write_text(str(os.getpid()))
        client_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        env = dict(os.environ)
        if platform.machine() in ("aarch64", "arm64"):
            env["ETCD_UNSUPPORTED_ARCH"] = "arm64"  # etcd 3.4 refuses arm64 without it
        self._etcd = _Process(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=linkpack-test",
                f"--data-dir={self._etcd_data / 'data'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=linkpack-test={peer_url}",
            ],
            self.log_dir / "etcd.log",
            env,
        )
        wait_for(
            lambda: self._etcd_healthy(client_url),
            _START_TIMEOUT_S,
            "etcd /health",
            on_timeout=lambda: tail(self.log_dir / "etcd.log"),
        )

    def _etcd_healthy(self, client_url: str) -> bool:
        assert self._etcd is not None
        self._etcd.check_alive()
        with urllib.request.urlopen(f"{client_url}/health", timeout=2) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")

    def _write_credentials(self) -> None:
        key, pub = self.workdir / "sa.key", self.workdir / "sa.pub"
        for argv in (
            ["openssl", "genrsa", "-out", str(key), "2048"],
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
        ):
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode != 0:
                raise ControlPlaneError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
        # token,user,uid,"group1,group2"
        (self.workdir / "tokens.csv").write_text(f'{self.token},{ADMIN_USER},1,"system:masters"\n')

    def _start_apiserver(self) -> None:
        self.apiserver_port = free_port()
        d = self.workdir
        self._apiserver = _Process(
            "kube-apiserver",
            [
                str(self.binaries.apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--secure-port={self.apiserver_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--cert-dir={d / 'certs'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--profiling=false",
                # The default reconciler would publish 127.0.0.1 as the `kubernetes` Service's
                # endpoint, which validation refuses (loopback), and log that every 10 s.
                "--endpoint-reconciler-type=none",
                *self._extra_apiserver_args,
            ],
            self.log_dir / "kube-apiserver.log",
        )
        wait_for(
            self._apiserver_ready,
            _START_TIMEOUT_S,
            "kube-apiserver /readyz",
            interval_s=0.5,
            on_timeout=lambda: tail(self.log_dir / "kube-apiserver.log"),
        )

    def _apiserver_ready(self) -> bool:
        assert self._apiserver is not None
        self._apiserver.check_alive()
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "linkpack-test",
                    "cluster": {"server": self.server, "insecure-skip-tls-verify": True},
                }
            ],
            "users": [{"name": ADMIN_USER, "user": {"token": self.token}}],
            "contexts": [
                {"name": "linkpack-test", "context": {"cluster": "linkpack-test", "user": ADMIN_USER}}
            ],
            "current-context": "linkpack-test",
        }
        self.kubeconfig_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig_path.chmod(0o600)

    def _wait_for_namespaces(self) -> None:
        core = client.CoreV1Api(self.api_client())

        def present() -> bool:
            names = {ns.metadata.name for ns in core.list_namespace().items if ns.metadata}
            return {"default", "kube-system"} <= names

        wait_for(present, _START_TIMEOUT_S, "namespaces default and kube-system")

    # ------------------------------------------------------------------ clients

    def api_client(self, token: str | None = None) -> client.ApiClient:
        """A new ApiClient for the admin (or for `token`, e.g. a service account's)."""
        configuration = client.Configuration()
        configuration.host = self.server
        configuration.verify_ssl = False
        configuration.api_key = {"authorization": token or self.token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(configuration)

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token for an existing ServiceAccount (TokenRequest; no controller needed)."""
        core = client.CoreV1Api(self.api_client())
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
        )
        response = core.create_namespaced_service_account_token(name, namespace, request)
        if response.status is None or not response.status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} returned no token")
        return response.status.token

    def dynamic_client(self) -> DynamicClient:
        """A DynamicClient whose discovery cache lives in the work directory (not in /tmp)."""
        return DynamicClient(self.api_client(), cache_file=str(self.workdir / "discovery-cache.json"))

    def create_objects(
        self, objects: Iterable[Mapping[str, Any]], dry_run: bool = False, exist_ok: bool = False
    ) -> list[dict[str, Any]]:
        """Create manifest objects (see `create_objects`)."""
        return create_objects(self.dynamic_client(), objects, dry_run=dry_run, exist_ok=exist_ok)

    # ------------------------------------------------------------------ scheduler

    def start_scheduler(self, config_text: str, verbosity: int = 2, wait_s: float = 60.0) -> Path:
        """Start kube-scheduler with this KubeSchedulerConfiguration; returns its log path.

        With leader election on (the default), the Lease's namespace is created if missing and
        this waits until the lease is acquired; otherwise until the scheduler starts. Raises
        ControlPlaneError with the log tail if the scheduler exits first (e.g. a bad config).
        """
        if self._scheduler is not None:
            raise ControlPlaneError("kube-scheduler already running; call stop_scheduler() first")
        config = yaml.safe_load(config_text) or {}
        election = config.get("leaderElection") or {}
        leader_elect = bool(election.get("leaderElect", True))
        if leader_elect:
            self._ensure_namespace(str(election.get("resourceNamespace") or "kube-system"))
        self._scheduler_runs += 1
        run = self._scheduler_runs
        config_path = self.workdir / f"scheduler-config-{run}.yaml"
        config_path.write_text(config_text)
        log_path = self.log_dir / (f"kube-scheduler-{run}.log" if run > 1 else "kube-scheduler.log")
        self._scheduler = _Process(
            "kube-scheduler",
            [str(self.binaries.scheduler), f"--config={config_path}", "--secure-port=0", f"--v={verbosity}"],
            log_path,
        )
        process = self._scheduler
        marker = "successfully acquired lease" if leader_elect else "starting kubernetes scheduler"

        def started() -> bool:
            process.check_alive()
            return marker in log_path.read_text(errors="replace").lower()

        try:
            wait_for(started, wait_s, f"kube-scheduler ({marker!r})", on_timeout=lambda: tail(log_path))
        except BaseException:
            self.stop_scheduler()
            raise
        return log_path

    def _ensure_namespace(self, name: str) -> None:
        core = client.CoreV1Api(self.api_client())
        try:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        except ApiException as exc:
            if exc.status != 409:
                raise

    @property
    def scheduler_log_path(self) -> Path | None:
        return self._scheduler.log_path if self._scheduler is not None else None

    def scheduler_log(self) -> str:
        path = self.scheduler_log_path
        return path.read_text(errors="replace") if path is not None else ""

    def stop_scheduler(self) -> None:
        if self._scheduler is not None:
            process, self._scheduler = self._scheduler, None
            process.stop()

    # ------------------------------------------------------------------ fake nodes

    def create_fake_node(
        self,
        name: str,
        capacity: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A Ready node without a kubelet: `capacity` (merged over cpu/memory/pods defaults) is
        published as capacity and allocatable, and the not-ready taint added at creation is removed."""
        return create_fake_node(self.api_client(), name, capacity, labels, annotations)


# ---------------------------------------------------------------------- helpers on any ApiClient

DEFAULT_NODE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}


def create_fake_node(
    api: client.ApiClient,
    name: str,
    capacity: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    resources = {**DEFAULT_NODE_CAPACITY, **capacity}
    body = node_object(name, labels=labels or {}, annotations=annotations or {})
    core.create_node(body)  # type: ignore[arg-type]  # the client accepts plain dicts
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fake node (no kubelet)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
        }
    }
    core.patch_node_status(name, status)
    # The TaintNodesByCondition admission plugin added node.kubernetes.io/not-ready at creation.
    patched = core.patch_node(name, {"spec": {"taints": None}})
    return dict(api.sanitize_for_serialization(patched))


def delete_fake_node(api: client.ApiClient, name: str) -> None:
    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).delete_node(name)


def bind_pod(api: client.ApiClient, namespace: str, name: str, node: str, uid: str | None = None) -> int:
    """POST pods/{name}/binding without the client's Binding deserialisation bug; the HTTP status."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    # The response is a Status, not the Binding the client expects: take it raw (protocols.md §6.2).
    response: Any = client.CoreV1Api(api).create_namespaced_pod_binding(
        name,
        namespace,
        body,  # type: ignore[arg-type]
        _preload_content=False,
    )
    return int(response.status)


# ---------------------------------------------------------------------- manifests


def create_objects(
    dynamic: DynamicClient,
    objects: Iterable[Mapping[str, Any]],
    dry_run: bool = False,
    exist_ok: bool = False,
) -> list[dict[str, Any]]:
    """POST each object to its resource (found by discovery); the created objects, in order.

    `dry_run` asks the server to validate and admit without storing (dryRun=All); `exist_ok`
    skips objects that already exist (409) and returns the stored object in their place.
    """
    created: list[dict[str, Any]] = []
    for obj in objects:
        api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
        try:
            resource = dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:  # e.g. a kind whose CRD was created a moment ago
            dynamic.resources.invalidate_cache()
            resource = dynamic.resources.get(api_version=api_version, kind=kind)
        metadata = obj.get("metadata") or {}
        namespace = (metadata.get("namespace") or "default") if resource.namespaced else None
        try:
            result = resource.create(body=dict(obj), namespace=namespace, dry_run="All" if dry_run else None)
        except ConflictError:
            if not exist_ok:
                raise
            result = resource.get(name=metadata.get("name"), namespace=namespace)
        created.append(result.to_dict())
    return created


def wait_for_crd(api: client.ApiClient, name: str, timeout_s: float = 30.0) -> None:
    """Until the CustomResourceDefinition `name` is Established (its API is served)."""
    extensions = client.ApiextensionsV1Api(api)

    def established() -> bool:
        crd = extensions.read_custom_resource_definition(name)
        conditions = (crd.status.conditions if crd.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, timeout_s, f"CRD {name} to be Established")


def load_manifest(path: Path) -> list[dict[str, Any]]:
    """The objects in a (multi-document) YAML file, skipping empty documents."""
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def render_scheduler_config(
    extender_url: str,
    kubeconfig_path: Path | str,
    tls: TlsSet | None = None,
    template: Path = SCHEDULER_CONFIG,
) -> str:
    """manifests/scheduler-config.yaml with the extender URL, kubeconfig path and client
    certificate paths substituted. With `tls` the scheduler speaks mutual TLS with the test
    certificates; without it (only for the no-op extenders of tests and benchmarks) plain HTTP."""
    text = template.read_text()
    placeholders = (
        EXTENDER_URL_PLACEHOLDER,
        KUBECONFIG_PLACEHOLDER,
        *TLS_PLACEHOLDERS,
        SERVER_NAME_PLACEHOLDER,
    )
    for placeholder in placeholders:
        count = text.count(placeholder)
        if count != 1:
            raise ValueError(f"{template}: expected {placeholder!r} exactly once, found it {count} times")
    text = text.replace(EXTENDER_URL_PLACEHOLDER, extender_url.rstrip("/"))
    text = text.replace(KUBECONFIG_PLACEHOLDER, str(kubeconfig_path))
    if tls is None:
        return _without_tls(text)
    for placeholder, path in zip(
        TLS_PLACEHOLDERS, (tls.client_cert, tls.client_key, tls.server_ca), strict=True
    ):
        text = text.replace(placeholder, str(path))
    return text.replace(SERVER_NAME_PLACEHOLDER, "serverName: 127.0.0.1")


def _without_tls(text: str) -> str:
    """The configuration with the extender's tlsConfig block dropped and HTTPS off."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "tlsConfig:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (
        len(lines[end]) - len(lines[end].lstrip()) > indent or not lines[end].strip()
    ):
        end += 1
    del lines[start:end]
    return "\n".join(lines).replace("enableHTTPS: true", "enableHTTPS: false") + "\n"


@contextlib.contextmanager
def temporary_namespace(api: client.ApiClient, prefix: str = "t-") -> Iterator[str]:
    """A fresh namespace; its pods are deleted at once (no kubelet) and it is deleted after."""
    core = client.CoreV1Api(api)
    created = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(generate_name=prefix)))
    assert created.metadata is not None
    name = str(created.metadata.name)
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)
