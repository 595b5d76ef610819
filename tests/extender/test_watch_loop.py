"""List+watch resumes from resourceVersion, relists on 410 Gone and forgets what vanished."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from extender.config import ExtenderConfig
from extender.kube import watch as kube


@dataclass
class _Raw:
    data: bytes


def _node(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class _FakeApi:
    """LIST answers from a script; WATCH streams scripted events and records where it resumed."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]]]) -> None:
        self.lists = lists
        self.watches = watches
        self.watched_from: list[str] = []

    def list_fn(self, **kw: Any) -> _Raw:
        items = self.lists.pop(0)
        return _Raw(
            json.dumps({"metadata": {"resourceVersion": str(100 + len(self.lists))}, "items": items}).encode()
        )


class _FakeWatch:
    def __init__(self, api: _FakeApi) -> None:
        self.api = api

    def stream(self, func: Any, resource_version: str, **kw: Any) -> Iterator[dict[str, Any]]:
        self.api.watched_from.append(resource_version)
        yield from self.api.watches.pop(0) if self.api.watches else []

    def stop(self) -> None:
        return None


def test_expired_watch_relists_and_forgets_vanished_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _FakeApi(
        lists=[[_node("a", "1"), _node("b", "2")], [_node("b", "7")]],
        watches=[
            [
                {"type": "BOOKMARK", "raw_object": _node("", "5")},
                {"type": "MODIFIED", "raw_object": _node("b", "6")},
                {"type": "ERROR", "raw_object": {"code": 410, "message": "too old resource version"}},
            ]
        ],
    )
    monkeypatch.setattr(kube, "_new_watch", lambda: _FakeWatch(api))
    seen: list[tuple[str, str]] = []
    vanished: list[str] = []
    synced: list[str] = []
    sink = kube.Sink(
        "nodes",
        lambda ev, o: seen.append((ev, o["metadata"]["name"])),
        synced.append,
        lambda o: o["metadata"]["name"],
        vanished.append,
    )
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return len(api.lists) == 0 and calls["n"] > 6

    loop = kube.ListWatch("nodes", api.list_fn, sink, stop, ExtenderConfig(resync_period_s=0.2))
    loop.run()
    assert api.watched_from[0] == "101"  # resumed from the first list's resourceVersion
    assert ("MODIFIED", "b") in seen
    assert vanished == ["a"]  # gone while the watch was expired: removed on relist
    assert synced.count("nodes") == 2
