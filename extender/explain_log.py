"""The explain log: the last filter, prioritize and bind outcome per pod, for `/debug/explain` and
`kubectl linkpack explain`.

The answers on the wire are short (a decided filter answer names the chosen node alone); the
reasons every other node failed, the scores and the bind error stay here, for the most recent
pods (the oldest are forgotten first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from extender.placing.filter_outcome import FilterOutcome
from extender.state.pod_requests import PodRequest, RequestError
from topology.scoring import Ranking

PODS_KEPT = 2048


@dataclass
class PodDecisions:
    """The last filter, prioritize and bind outcome seen for one pod (for /debug/explain)."""

    request: PodRequest | RequestError | None = None
    filtered: FilterOutcome | None = None
    ranking: Ranking | None = None
    bound_node: str = ""
    bind_error: str = ""
    at: float = field(default_factory=time.time)


class ExplainLog:
    """The decisions of the last `PODS_KEPT` pods seen, by "namespace/name"; safe across threads."""

    def __init__(self, limit: int = PODS_KEPT) -> None:
        self._limit = limit
        self._entries: OrderedDict[str, PodDecisions] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, namespace: str, name: str) -> PodDecisions | None:
        with self._lock:
            return self._entries.get(f"{namespace}/{name}")

    def entry(self, key: str) -> PodDecisions:
        """The pod's entry (new when it has none), stamped now and made the most recent."""
        with self._lock:
            entry = self._entries.pop(key, None) or PodDecisions()
            entry.at = time.time()
            self._entries[key] = entry
            while len(self._entries) > self._limit:
                self._entries.popitem(last=False)
            return entry
