"""Plain JSON requests to the API server, for the calls on the extender's request path.

Bind makes two writes per pod (the ledger commit, then the Binding) and sometimes reads a pod
or a ledger. The generated Kubernetes client validates every argument, walks the body to
serialise it and shares one small connection pool with the six long-running watches, so under
concurrent binds it keeps opening and dropping TLS connections. Here the same credentials and
TLS settings (the kubeconfig or in-cluster service account, loaded by `extender.kube.client.load_client`,
tokens refreshed the same way) drive a connection pool of our own, and a call is one urllib3
request with a JSON body. Failures come back as `ApiReply` values or urllib3/OS errors, which
`extender.kube.client` translates; nothing else sees them.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client
from kubernetes.client import rest

log = logging.getLogger(__name__)

POOL_SIZE = 32  # concurrent binds of one scheduler stay well below this
TIMEOUT = urllib3.Timeout(connect=10.0, read=30.0)
_AGENT = "linkpack-extender"
#: How long credential headers are reused before the configuration is asked again. The client
#: library's own in-cluster loader re-reads the service account token once a minute; the kubelet
#: renews it long before it expires.
AUTH_REFRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class ApiReply:
    status: int
    data: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.data)

    def message(self) -> str:
        """The API server's Status message, or the start of the body."""
        try:
            doc = json.loads(self.data)
        except ValueError:
            return self.data[:200].decode("utf-8", "replace")
        return str(doc.get("message") or doc.get("reason") or "") if isinstance(doc, dict) else ""


def path(*parts: str) -> str:
    """An API path from segments, each quoted (names never contain '/', but be safe)."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


class ApiRequests:
    """JSON over the API client's credentials and TLS settings, on a connection pool of its own.

    Requests go straight to the API server's connection pool (no per-call URL parsing and pool
    lookup), and the credential headers are taken from the client configuration at most every
    `AUTH_REFRESH_S` (its refresh hook re-reads the kubeconfig or the service account token, far
    too slow for every call), and again at once when the API server answers 401."""

    def __init__(
        self,
        api_client: client.ApiClient,
        pool_size: int = POOL_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        cfg: Any = copy.copy(api_client.configuration)  # shares the token and its refresh hook
        cfg.connection_pool_maxsize = pool_size
        self._cfg = cfg
        self._clock = clock
        self._pool: Any = rest.RESTClientObject(cfg).pool_manager
        self._base = str(cfg.host).rstrip("/")
        url = urllib3.util.parse_url(self._base)
        # a proxy keeps the pool manager's own routing; otherwise one pool, paths under the base
        self._direct: Any = None if cfg.proxy else self._pool.connection_from_url(self._base)
        self._prefix = (url.path or "").rstrip("/")
        self._auth_lock = threading.Lock()
        self._auth: dict[str, str] = {}
        self._auth_at = float("-inf")
        if not cfg.verify_ssl:  # the kubeconfig asks for it: say so once, not on every request
            log.warning("the API server's certificate is not verified (insecure-skip-tls-verify)")
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    def close(self) -> None:
        self._pool.clear()

    def call(self, method: str, api_path: str, body: object = None) -> ApiReply:
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        reply = self._send(method, api_path, data, self._credentials(fresh=False))
        if reply.status == 401:  # the token may have been rotated since it was last read
            reply = self._send(method, api_path, data, self._credentials(fresh=True))
        return reply

    def _send(self, method: str, api_path: str, data: bytes | None, auth: dict[str, str]) -> ApiReply:
        headers = {"Accept": "application/json", "User-Agent": _AGENT, **auth}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._direct is not None:  # the API server's own pool: a path, no redirects followed
            send, url, extra = self._direct.urlopen, self._prefix + api_path, {"redirect": False}
        else:
            send, url, extra = self._pool.request, self._base + api_path, {}
        reply = send(method, url, body=data, headers=headers, timeout=TIMEOUT, preload_content=True, **extra)
        return ApiReply(int(reply.status), bytes(reply.data))

    def _credentials(self, fresh: bool) -> dict[str, str]:
        """The credential headers, from the configuration (its refresh hook renews an expiring
        token) when `fresh` or older than `AUTH_REFRESH_S`."""
        with self._auth_lock:
            now = self._clock()
            if fresh or now - self._auth_at >= AUTH_REFRESH_S:
                headers: dict[str, str] = {}
                for auth in self._cfg.auth_settings().values():
                    if auth.get("in") == "header" and auth.get("value"):
                        headers[str(auth["key"])] = str(auth["value"])
                self._auth, self._auth_at = headers, now
            return self._auth
