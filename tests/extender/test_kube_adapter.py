"""The Kubernetes adapter's request path, with the API server's replies given as values: status
codes become the ApiError kinds the binder acts on, and the watch's echo of our own ledger commit
is not applied a second time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from contract.keys import ledger_name
from contract.ledger import Ledger, encode_ledger
from extender.config import ExtenderConfig
from extender.kube.api_requests import ApiReply
from extender.kube.client import KubeClusterApi
from extender.state.cluster_api import ApiConflict, ApiError, ApiNotFound, WatchHandlers

pytestmark = pytest.mark.timeout(180)


class ScriptedApi:
    """Answers each request with the next scripted reply and records what was asked."""

    def __init__(self, *replies: ApiReply) -> None:
        self.replies = list(replies)
        self.asked: list[tuple[str, str, object]] = []

    def call(self, method: str, api_path: str, body: object = None) -> ApiReply:
        self.asked.append((method, api_path, body))
        return self.replies.pop(0)

    def close(self) -> None:
        return


def _adapter(scripted: ScriptedApi) -> KubeClusterApi:
    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    return KubeClusterApi(api_client, ExtenderConfig(), requests=scripted)  # type: ignore[arg-type]


def _config_map(node: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": ledger_name(node), "resourceVersion": rv}, "data": {}}


def _reply(status: int, doc: object) -> ApiReply:
    return ApiReply(status, json.dumps(doc).encode())


def test_a_stale_commit_is_a_conflict_and_a_missing_pod_is_not_found() -> None:
    """409 on the ledger's compare-and-swap is ApiConflict (re-read and retry), 404 on a pod is
    ApiNotFound, anything else an ApiError naming the call and the API server's message."""
    api = _adapter(
        ScriptedApi(
            _reply(409, {"message": "the object has been modified"}),
            _reply(404, {"message": 'pods "x" not found'}),
            _reply(500, {"message": "etcd is sad"}),
        )
    )
    with pytest.raises(ApiConflict, match="commit ledger of n1: the object has been modified"):
        api.write_ledger(Ledger("n1", (), "41"))
    with pytest.raises(ApiNotFound, match='read pod ml/x: pods "x" not found'):
        api.read_pod("ml", "x")
    with pytest.raises(ApiError, match="HTTP 500 etcd is sad"):
        api.bind("ml", "x", "uid-1", "", "n1", {})


def test_the_commit_carries_the_resource_version_and_the_binding_the_uid() -> None:
    """The compare-and-swap and the re-created-pod guard travel in the request bodies."""
    scripted = ScriptedApi(_reply(200, _config_map("n1", "42")), _reply(201, {"kind": "Status"}))
    api = _adapter(scripted)
    committed = api.write_ledger(Ledger("n1", (), "41"))
    api.bind("ml", "x", "uid-1", "", "n1", {"k": "v"})
    (put, put_path, ledger_body), (post, post_path, binding) = scripted.asked
    assert (put, committed.resource_version) == ("PUT", "42")
    assert put_path.endswith(f"/configmaps/{ledger_name('n1')}")
    assert ledger_body["metadata"]["resourceVersion"] == "41"  # type: ignore[index]
    assert (post, post_path) == ("POST", "/api/v1/namespaces/ml/pods/x/binding")
    assert binding["metadata"]["uid"] == "uid-1"  # type: ignore[index]


def test_the_watch_echo_of_our_own_commit_is_not_applied_again() -> None:
    """The binder applies the committed ledger itself; the same version arriving by watch is
    dropped, a newer version (another writer) is applied."""
    api = _adapter(ScriptedApi(_reply(200, _config_map("n1", "42"))))
    applied: list[Ledger] = []
    ignore: Any = lambda *_: None  # noqa: E731
    handlers = WatchHandlers(
        ignore, ignore, ignore, applied.append, ignore, ignore, ignore, ignore, ignore, ignore, ignore, ignore
    )
    sink = api.ledger_sink(handlers)
    api.write_ledger(Ledger("n1", (), "41"))
    sink.apply("MODIFIED", _config_map("n1", "42"))
    assert applied == []
    sink.apply("MODIFIED", _config_map("n1", "43"))
    assert [ledger.resource_version for ledger in applied] == ["43"]


def _two_entry_ledger(version: str) -> Ledger:
    from contract.allocation import Allocation
    from contract.ledger import LedgerEntry
    from topology.scheduling import GpuGrant

    def entry(uid: str, gpu: int, at: float) -> LedgerEntry:
        grant = GpuGrant(index=gpu, uuid=f"GPU-{gpu}", whole=True)
        return LedgerEntry(uid, "ml", f"pod-{uid}", Allocation("n1", (grant,)), at)

    return Ledger("n1", (entry("a", 0, 1733126400.25), entry("b", 1, 1733126401.5)), version)


def test_a_commit_stored_as_sent_comes_back_as_the_ledger_sent_at_the_new_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API server stores a ConfigMap's data as sent: the committed ledger is the one sent,
    at the reply's resourceVersion, equal to decoding the reply, without decoding it; data the
    server changed is decoded from the reply."""
    import extender.kube.client as kube

    sent = _two_entry_ledger("41")
    stored = {**_config_map("n1", "42"), "data": encode_ledger(sent)}
    decoded = kube.ledger_from_config_map(stored)
    api = _adapter(ScriptedApi(_reply(200, stored)))
    monkeypatch.setattr(kube, "ledger_from_config_map", lambda _doc: pytest.fail("decoded again"))
    committed = api.write_ledger(sent)
    assert committed == decoded and committed.resource_version == "42"
    monkeypatch.undo()
    changed = {**stored, "data": encode_ledger(Ledger("n1", sent.entries[:1]))}
    api = _adapter(
        ScriptedApi(_reply(200, {**changed, "metadata": {**changed["metadata"], "resourceVersion": "43"}}))
    )
    committed = api.write_ledger(sent)
    assert committed.entries == sent.entries[:1] and committed.resource_version == "43"
