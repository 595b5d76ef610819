"""Bulk ingest with Python's cyclic garbage collector paused.

A relist parses the whole list (at 10,000 nodes about 75 MB of JSON, millions of dicts and
lists) and decodes it item by item. Everything it allocates is either kept or freed by
reference counting, yet the allocations trigger full collections that walk the whole freshly
parsed list, each taking a large share of a second and freeing nothing. `collector_paused`
turns the collector off for such a stretch and back on when the last stretch running in any
thread ends (the watches of several kinds relist at once); a collector someone else turned off
stays off.

When it turns the collector back on, everything the stretch made goes straight to the oldest
generation (`gc.freeze()` then `gc.unfreeze()`: two list splices, no walk). Left in the youngest
generation, the decoded fleet was walked three times over as it aged through the generations
(about 0.3 s of the start at 10,000 nodes); in the oldest it is walked by the next full
collection only, which also collects any cycle the stretch made. It stays in the collector's
count: the state decoded at start-up is not kept frozen, because with the fleet out of the count
full collections came far more often while serving and the warm filter's p99 was worse in every
round measured.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """How many stretches are running, and whether the collector was on before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.was_enabled = False


_pauses = _Pauses()


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the duration (nested and concurrent uses share one pause)."""
    with _pauses.lock:
        if _pauses.running == 0:
            _pauses.was_enabled = gc.isenabled()
            gc.disable()
        _pauses.running += 1
    try:
        yield
    finally:
        with _pauses.lock:
            _pauses.running -= 1
            if _pauses.running == 0 and _pauses.was_enabled:
                gc.freeze()  # the stretch's objects (and all others) to the oldest generation
                gc.unfreeze()
                gc.enable()
