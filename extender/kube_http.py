"""Plain JSON requests to the API server, for the calls on the extender's request path.

Bind makes two writes per pod (the ledger commit, then the Binding) and sometimes reads a pod
or a ledger. The generated Kubernetes client validates every argument, walks the body to
serialise it and shares one small connection pool with the six long-running watches, so under
concurrent binds it keeps opening and dropping TLS connections. Here the same credentials and
TLS settings (the kubeconfig or in-cluster service account, loaded by `extender.kube.load_client`,
tokens refreshed the same way) drive a connection pool of our own, and a call is one urllib3
request with a JSON body. Failures come back as `ApiReply` values or urllib3/OS errors, which
`extender.kube` translates; nothing else sees them.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client
from kubernetes.client import rest

log = logging.getLogger("linkpack.extender.kube")

POOL_SIZE = 32  # concurrent binds of one scheduler stay well below this
TIMEOUT = urllib3.Timeout(connect=10.0, read=30.0)
_AGENT = "linkpack-extender"


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
    """JSON over the API client's credentials and TLS settings, on a connection pool of its own."""

    def __init__(self, api_client: client.ApiClient, pool_size: int = POOL_SIZE) -> None:
        cfg: Any = copy.copy(api_client.configuration)  # shares the token and its refresh hook
        cfg.connection_pool_maxsize = pool_size
        self._cfg = cfg
        self._pool: Any = rest.RESTClientObject(cfg).pool_manager
        self._base = str(cfg.host).rstrip("/")
        if not cfg.verify_ssl:  # the kubeconfig asks for it: say so once, not on every request
            log.warning("the API server's certificate is not verified (insecure-skip-tls-verify)")
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    def close(self) -> None:
        self._pool.clear()

    def call(self, method: str, api_path: str, body: object = None) -> ApiReply:
        headers = {"Accept": "application/json", "User-Agent": _AGENT}
        for auth in self._cfg.auth_settings().values():  # refreshes an expiring token first
            if auth.get("in") == "header" and auth.get("value"):
                headers[str(auth["key"])] = str(auth["value"])
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        reply = self._pool.request(
            method, self._base + api_path, body=data, headers=headers, timeout=TIMEOUT, preload_content=True
        )
        return ApiReply(int(reply.status), bytes(reply.data))
