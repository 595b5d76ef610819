"""List-and-watch loops for the extender's Kubernetes adapter (`extender.kube.client`).

LIST, then WATCH from the list's resourceVersion; relist on 410 Gone and at every resync, and
tell the sink about objects that vanished in between. Client exceptions stay in here and in
`extender.kube.client`; the sinks see only JSON objects.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from extender.config import ExtenderConfig
from extender.kube.gc_pause import collector_paused
from extender.state.cluster_api import ApiError

log = logging.getLogger(__name__)

_FAILURES = (ApiException, HTTPError, OSError, ValueError)


def _new_watch() -> Any:
    factory: Any = watch.Watch
    w = factory()
    # The sinks read the raw JSON objects; without this the client would also re-encode every
    # event and build its model classes from it (most of a watch's CPU time for pods).
    w.get_return_type = lambda _func: None
    return w


class Sink:
    """Where one kind's events go, and how a relist removes what vanished meanwhile."""

    def __init__(
        self,
        kind: str,
        apply: Callable[[str, Mapping[str, Any]], None],
        synced: Callable[[str], None],
        key: Callable[[Mapping[str, Any]], str],
        vanished: Callable[[str], None],
        revision: Callable[[str], None] | None = None,
    ) -> None:
        self.kind, self.apply, self.synced, self.key, self.vanished = kind, apply, synced, key, vanished
        #: told each event's resourceVersion just before the event is applied (and a list's before
        #: its items), so whoever sees an applied event reads a revision at least its own
        self.revision = revision


class ListWatch:
    """LIST, then WATCH from the list's resourceVersion; relist on 410 Gone and every resync."""

    def __init__(
        self,
        kind: str,
        list_fn: Callable[..., Any],
        sink: Sink,
        stop: Callable[[], bool],
        cfg: ExtenderConfig,
    ) -> None:
        self.kind, self._list, self._sink, self._stop, self._cfg = kind, list_fn, sink, stop, cfg
        self._known: set[str] = set()

    def run(self) -> None:
        backoff = 0.5
        while not self._stop():
            try:
                rv = self._relist()
                self._sink.synced(self.kind)
                self._watch(rv)
                backoff = 0.5
            except (*_FAILURES, ApiError) as exc:
                if self._stop():
                    return  # stopping: the error is the connection being closed under us
                log.warning("watch of %s interrupted (%s); relisting in %.1fs", self.kind, exc, backoff)
                deadline = time.monotonic() + backoff
                while time.monotonic() < deadline and not self._stop():
                    time.sleep(0.1)
                backoff = min(backoff * 2, 10.0)

    def _relist(self) -> str:
        raw = self._list(_preload_content=False)
        with collector_paused():  # parsing and decoding the whole list frees nothing cyclic
            doc = json.loads(raw.data)
            rv = str((doc.get("metadata") or {}).get("resourceVersion") or "")
            if self._sink.revision is not None and rv:
                self._sink.revision(rv)
            seen: set[str] = set()
            for item in doc.get("items") or []:
                self._sink.apply("ADDED", item)
                seen.add(self._sink.key(item))
            del doc
        for gone in sorted(self._known - seen):
            self._sink.vanished(gone)
        self._known = seen
        return rv

    def _watch(self, rv: str) -> None:
        deadline = time.monotonic() + self._cfg.resync_period_s
        while not self._stop() and time.monotonic() < deadline:
            w: Any = _new_watch()
            timeout = max(1, min(30, int(deadline - time.monotonic())))
            try:
                for event in self._events(w, rv, timeout):
                    kind = event.get("type")
                    obj = event.get("raw_object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            return  # expired: relist
                        raise ApiError(f"watch {self.kind}: {obj.get('message')}")
                    meta = obj.get("metadata") or {}
                    rv = str(meta.get("resourceVersion") or rv)
                    if self._sink.revision is not None and rv:
                        self._sink.revision(rv)
                    if kind == "BOOKMARK":
                        continue
                    self._sink.apply(str(kind), obj)
                    key = self._sink.key(obj)
                    (self._known.discard if kind == "DELETED" else self._known.add)(key)
                    if self._stop():
                        return
            except ApiException as exc:
                if exc.status == 410:
                    return
                raise
            finally:
                w.stop()

    def _events(self, w: Any, rv: str, timeout: int) -> Iterator[dict[str, Any]]:
        yield from w.stream(
            self._list, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=timeout
        )
