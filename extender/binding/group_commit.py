"""Group commit: binds to one node that arrive together share one ledger write.

kube-scheduler runs each pod's binding cycle on its own goroutine, so while one bind to a node
commits, the next pods placed on that node are already asking. Each bind hands its commit to
the node's queue; one caller at a time leads: it takes everything waiting for that node (up to
`max_batch`), commits it with one call of `commit`, wakes every caller of the batch with its own
outcome, and hands the lead to the first caller still waiting. A caller that finds the node idle
leads at once, so a lone bind waits for nothing. Nodes never wait for each other.

What a batch means is the caller's business (`Binder.commit_batch` plans the pods one after the
other on one copy of the ledger and writes it once, with the same compare-and-swap as a single
commit). An exception from `commit` is raised in every caller of that batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(eq=False)
class _Caller(Generic[Item, Result]):
    item: Item
    wake: threading.Event = field(default_factory=threading.Event)
    leads: bool = False
    done: bool = False
    outcome: Result | None = None
    error: BaseException | None = None


@dataclass(eq=False)
class _NodeQueue(Generic[Item, Result]):
    waiting: list[_Caller[Item, Result]] = field(default_factory=list)
    led: bool = False


class GroupCommit(Generic[Item, Result]):
    """Per-key batching of blocking commits; `submit` returns this caller's own outcome."""

    def __init__(
        self, commit: Callable[[str, Sequence[Item]], Sequence[Result]], max_batch: int = 64
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._commit = commit
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queues: dict[str, _NodeQueue[Item, Result]] = {}
        self.batches = 0  # commits made (for tests and metrics)
        self.items = 0  # items committed in them

    def waiting(self, key: str) -> int:
        """Callers queued on `key` and not yet taken into a batch (0 while the key is idle)."""
        with self._lock:
            queue = self._queues.get(key)
            return len(queue.waiting) if queue is not None else 0

    @property
    def busy_keys(self) -> frozenset[str]:
        """The keys with a commit under way or callers waiting (empty when every key is idle)."""
        with self._lock:
            return frozenset(self._queues)

    def submit(self, key: str, item: Item) -> Result:
        me: _Caller[Item, Result] = _Caller(item)
        with self._lock:
            queue = self._queues.setdefault(key, _NodeQueue())
            queue.waiting.append(me)
            if not queue.led:
                queue.led = me.leads = True
        if not me.leads:
            me.wake.wait()
        if not me.done:
            self._lead(key)
        if me.error is not None:
            raise me.error
        return me.outcome  # type: ignore[return-value]  # set with done, for every caller

    def _lead(self, key: str) -> None:
        with self._lock:
            queue = self._queues[key]
            batch = queue.waiting[: self._max_batch]
            del queue.waiting[: self._max_batch]
        try:
            outcomes = self._commit(key, [c.item for c in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"commit answered {len(outcomes)} outcomes for {len(batch)} items")
        except BaseException as exc:  # every caller of the batch learns of it
            for caller in batch:
                caller.error = exc
        else:
            for caller, outcome in zip(batch, outcomes, strict=True):
                caller.outcome = outcome
        with self._lock:
            self.batches += 1
            self.items += len(batch)
            for caller in batch:
                caller.done = True
                caller.wake.set()
            if queue.waiting:
                successor = queue.waiting[0]
                successor.leads = True
                successor.wake.set()
            else:
                queue.led = False
                del self._queues[key]
