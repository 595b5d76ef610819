"""The one adapter between the plugin and the outside world: the API server and the extender.

`ClusterReader` is what the commands need: the GpuTopology objects, the Nodes (for the cordon
annotation and `spec.unschedulable`), the ledger ConfigMaps, the pods, and the extender's
explanation of one pod. `KubeReader` implements it with the `kubernetes` client (credentials:
`--kubeconfig`, else $KUBECONFIG, else ~/.kube/config, else in-cluster) and `httpx` for an
extender named by URL; otherwise `explain` goes through the API server's service proxy.

Objects come back as plain JSON (what `kubectl get -o json` prints), to be decoded by the pure
`kubectl_linkpack.decoded`. Every failure of the client, the network or the credentials leaves
this module as a `PluginError` naming what was being read; nothing else escapes it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import httpx
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from contract.keys import GROUP, LEDGER_LABEL, TOPOLOGY_PLURAL, TOPOLOGY_VERSION, ledger_name
from contract.scheduling_policy import POLICY_PLURAL, POLICY_VERSION
from kubectl_linkpack.errors import PluginError

#: The extender's debug port through the API server's service proxy (scheme:service:port name,
#: manifests/extender-deployment.yaml). The debug port checks the caller's own token, which the
#: proxy would drop from `Authorization`, so it travels in `X-Linkpack-Authorization` too.
EXTENDER_SERVICE = "https:linkpack-extender:debug"
#: A token to present instead of the kubeconfig's (e.g. from `kubectl create token`).
TOKEN_ENV = "LINKPACK_TOKEN"
#: The CA to check a directly named extender's certificate with (default: the system's).
EXTENDER_CA_ENV = "LINKPACK_EXTENDER_CA"
TIMEOUT_S = 15.0
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Doc = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ExtenderReply:
    """The extender's answer to GET /debug/explain: its HTTP status and JSON body."""

    status: int
    doc: Doc


class ClusterReader(Protocol):
    """What the commands read; every method raises `PluginError` and nothing else."""

    def topologies(self) -> list[Doc]:
        """Every GpuTopology object."""
        ...

    def topology(self, name: str) -> Doc | None:
        """One GpuTopology object (None: there is none of that name)."""
        ...

    def nodes(self) -> list[Doc]:
        """Every Node object."""
        ...

    def node(self, name: str) -> Doc | None:
        """One Node object (None: there is none of that name)."""
        ...

    def ledgers(self) -> list[Doc]:
        """Every ledger ConfigMap in Linkpack's namespace."""
        ...

    def ledger(self, node: str) -> Doc | None:
        """The ledger ConfigMap of one node (None: the extender never committed there)."""
        ...

    def pods(self, namespace: str | None) -> list[Doc]:
        """The pods of one namespace, or of all (None)."""
        ...

    def policies(self) -> list[Doc]:
        """Every GpuSchedulingPolicy object."""
        ...

    def namespaces(self) -> list[Doc]:
        """Every Namespace object (for their default policy)."""
        ...

    def explain(self, namespace: str, name: str) -> ExtenderReply:
        """The extender's explanation of one pod."""
        ...

    def default_namespace(self) -> str:
        """The namespace of the current context (never raises; "default" when unknown)."""
        ...


def kubeconfig_path(explicit: str | None) -> str | None:
    """--kubeconfig, else $KUBECONFIG, else ~/.kube/config when it exists, else None (in-cluster)."""
    if explicit:
        return explicit
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    home = Path.home() / ".kube" / "config"
    return str(home) if home.exists() else None


class KubeReader:
    """`ClusterReader` over the Kubernetes API; `explain` asks the extender."""

    def __init__(
        self,
        kubeconfig: str | None,
        context: str | None,
        system_namespace: str,
        extender_url: str | None,
    ) -> None:
        self._path = kubeconfig_path(kubeconfig)
        self._context = context
        self._system = system_namespace
        self._url = extender_url.rstrip("/") if extender_url else None
        self._client: Any = None

    # ------------------------------------------------------------------------- ClusterReader

    def topologies(self) -> list[Doc]:
        custom: Any = client.CustomObjectsApi(self._api())
        return _items(
            self._read(
                "listing GpuTopology objects",
                lambda: custom.list_cluster_custom_object(
                    GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL, _preload_content=False
                ),
            )
        )

    def topology(self, name: str) -> Doc | None:
        custom: Any = client.CustomObjectsApi(self._api())
        return self._read_optional(
            f"reading GpuTopology {name}",
            lambda: custom.get_cluster_custom_object(
                GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL, name, _preload_content=False
            ),
        )

    def nodes(self) -> list[Doc]:
        core: Any = client.CoreV1Api(self._api())
        return _items(self._read("listing Nodes", lambda: core.list_node(_preload_content=False)))

    def node(self, name: str) -> Doc | None:
        core: Any = client.CoreV1Api(self._api())
        return self._read_optional(
            f"reading Node {name}", lambda: core.read_node(name, _preload_content=False)
        )

    def ledgers(self) -> list[Doc]:
        core: Any = client.CoreV1Api(self._api())
        return _items(
            self._read(
                f"listing ledger ConfigMaps in {self._system}",
                lambda: core.list_namespaced_config_map(
                    self._system, label_selector=f"{LEDGER_LABEL}=true", _preload_content=False
                ),
            )
        )

    def ledger(self, node: str) -> Doc | None:
        core: Any = client.CoreV1Api(self._api())
        name = ledger_name(node)
        return self._read_optional(
            f"reading ledger ConfigMap {self._system}/{name}",
            lambda: core.read_namespaced_config_map(name, self._system, _preload_content=False),
        )

    def pods(self, namespace: str | None) -> list[Doc]:
        core: Any = client.CoreV1Api(self._api())
        if namespace is None:
            return _items(
                self._read("listing pods", lambda: core.list_pod_for_all_namespaces(_preload_content=False))
            )
        return _items(
            self._read(
                f"listing pods in {namespace}",
                lambda: core.list_namespaced_pod(namespace, _preload_content=False),
            )
        )

    def policies(self) -> list[Doc]:
        custom: Any = client.CustomObjectsApi(self._api())
        return _items(
            self._read(
                "listing GpuSchedulingPolicy objects",
                lambda: custom.list_cluster_custom_object(
                    GROUP, POLICY_VERSION, POLICY_PLURAL, _preload_content=False
                ),
            )
        )

    def namespaces(self) -> list[Doc]:
        core: Any = client.CoreV1Api(self._api())
        return _items(self._read("listing namespaces", lambda: core.list_namespace(_preload_content=False)))

    def explain(self, namespace: str, name: str) -> ExtenderReply:
        path = f"debug/explain/{quote(namespace, safe='')}/{quote(name, safe='')}"
        if self._url:
            return self._explain_direct(path)
        return self._explain_proxied(path)

    def default_namespace(self) -> str:
        if self._path:
            try:
                list_contexts: Any = config.list_kube_config_contexts  # untyped in the client
                contexts, active = list_contexts(config_file=self._path)
                if self._context:
                    active = next((c for c in contexts if c.get("name") == self._context), active)
                return str((active or {}).get("context", {}).get("namespace") or "default")
            except Exception:  # any unreadable kubeconfig: the API calls will say what is wrong
                return "default"
        try:
            return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"

    # ------------------------------------------------------------------------- internals

    def _api(self) -> Any:
        if self._client is None:
            try:
                if self._path:
                    from_file: Any = config.new_client_from_config  # untyped in the client
                    self._client = from_file(config_file=self._path, context=self._context)
                else:
                    load_incluster: Any = config.load_incluster_config  # untyped in the client
                    load_incluster()
                    self._client = client.ApiClient(client.Configuration.get_default_copy())
            except Exception as exc:
                raise PluginError(f"cannot load Kubernetes credentials: {exc}") from exc
        return self._client

    def _read(self, what: str, call: Callable[[], Any]) -> Doc:
        try:
            return _body(call())
        except Exception as exc:
            raise _failure(exc, what) from exc

    def _read_optional(self, what: str, call: Callable[[], Any]) -> Doc | None:
        try:
            return _body(call())
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _failure(exc, what) from exc
        except Exception as exc:
            raise _failure(exc, what) from exc

    def _bearer(self) -> str:
        """`Bearer <token>` for the debug endpoints: $LINKPACK_TOKEN, else the kubeconfig's token."""
        token = os.environ.get(TOKEN_ENV, "").strip()
        if token:
            return f"Bearer {token}"
        configuration = self._api().configuration
        value = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if not value:
            raise PluginError(
                "the extender's debug endpoints need a Kubernetes token and this kubeconfig has none "
                f"(it may use a client certificate): set ${TOKEN_ENV}, e.g. to the output of "
                "`kubectl create token <service-account>` for an account bound to linkpack-debug-reader"
            )
        return str(value) if str(value).lower().startswith("bearer ") else f"Bearer {value}"

    def _explain_direct(self, path: str) -> ExtenderReply:
        """Ask the extender at the URL. Its debug port is TLS only and checks the caller's token;
        a plain `http://` URL is an extender serving without authentication (`make demo`), which
        gets a token when one is at hand and is asked without one otherwise."""
        headers: dict[str, str] = {}
        if (self._url or "").lower().startswith("http://"):
            with contextlib.suppress(PluginError):
                headers["Authorization"] = self._bearer()
        else:
            headers["Authorization"] = self._bearer()
        verify: Any = os.environ.get(EXTENDER_CA_ENV) or True
        try:
            reply = httpx.get(f"{self._url}/{path}", headers=headers, timeout=TIMEOUT_S, verify=verify)
        except Exception as exc:  # httpx.HTTPError, and InvalidURL which is not one
            raise PluginError(f"asking the extender at {self._url}: {exc}") from exc
        return ExtenderReply(reply.status_code, _json_or_text(reply.text))

    def _explain_proxied(self, path: str) -> ExtenderReply:
        api = self._api()
        api.configuration.safe_chars_for_path_param = "/"  # the proxied path keeps its slashes
        core: Any = client.CoreV1Api(api)
        where = f"asking the extender through the service proxy of {self._system}/{EXTENDER_SERVICE}"
        try:
            raw = core.connect_get_namespaced_service_proxy_with_path(
                EXTENDER_SERVICE,
                self._system,
                path,
                _preload_content=False,
                _request_timeout=TIMEOUT_S,
                _headers={"X-Linkpack-Authorization": self._bearer()},
            )
            return ExtenderReply(int(raw.status), _json_or_text(raw.data.decode()))
        except ApiException as exc:
            body = exc.body.decode() if isinstance(exc.body, bytes) else str(exc.body or "")
            doc = _json_or_text(body)
            if exc.status == 404 and "pod" in doc:
                return ExtenderReply(404, doc)  # the extender's own answer, passed through by the proxy
            if exc.status in (401, 403) and "error" in doc and "linkpack" in str(doc.get("error")):
                raise PluginError(f"the extender refused: {doc['error']}") from exc
            raise _failure(exc, where) from exc
        except Exception as exc:
            raise _failure(exc, where) from exc


def _body(raw: Any) -> Doc:
    data = raw.data if hasattr(raw, "data") else raw
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"the API answered {type(doc).__name__}, not an object")
    return doc


def _items(doc: Doc) -> list[Doc]:
    items = doc.get("items") or []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _failure(exc: Exception, what: str) -> PluginError:
    if isinstance(exc, ApiException):
        message = exc.reason
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            message = json.loads(exc.body or "{}").get("message") or exc.reason
        return PluginError(f"{what}: HTTP {exc.status} {message}")
    return PluginError(f"{what}: {exc}")


def _json_or_text(text: str) -> Doc:
    try:
        doc = json.loads(text)
    except ValueError:
        return {"error": text.strip()[:500]}
    return doc if isinstance(doc, dict) else {"error": str(doc)}
