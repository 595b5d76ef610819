"""Values derived from answers that are never modified, remembered by the answers' identity.

The decisions hand out the same answer object while none of the nodes asked about changed
(`extender.placing.decisions.Decider`); whatever is derived from it (the wire answer, its JSON bytes,
the metrics tally) is then the same too and is looked up here instead of being rebuilt. Each
entry holds its source object, so an identity is never reused while it is remembered.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

V = TypeVar("V")


class Reuse(Generic[V]):
    """The last `size` (source object, derived value) pairs, most recently used last."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._items: list[tuple[object, V]] = []
        self._lock = threading.Lock()

    def get(self, source: object) -> V | None:
        """The value derived from this very object, or None."""
        with self._lock:
            for i, (known, value) in enumerate(self._items):
                if known is source:
                    if i != len(self._items) - 1:
                        self._items.append(self._items.pop(i))
                    return value
        return None

    def put(self, source: object, value: V) -> V:
        """Remember `value` as derived from `source` (dropping the least recently used); returns it."""
        with self._lock:
            self._items = [item for item in self._items if item[0] is not source]
            self._items.append((source, value))
            del self._items[: -self._size]
        return value
