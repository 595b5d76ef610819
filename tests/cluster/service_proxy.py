"""A stand-in for a Kubernetes Service in front of several extender replicas: a TCP proxy on
loopback that hands each new connection to the next Ready backend in turn (round-robin), the
way kube-proxy spreads connections over a Service's ready endpoints.

TLS passes through untouched (the scheduler and each extender speak mutual TLS end to end).
A backend is Ready while its ops port answers /readyz with 200, polled as the kubelet's
readiness probe would be; a killed backend drops out within one poll. A connection idle for
`idle_close_s` after the backend last sent something (an answer, not a request still being
worked on) is closed, so that a client's keep-alive pool keeps reaching every replica.
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

_CHUNK = 65536


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    port: int  # the verbs port (TLS)
    ops_url: str  # where /readyz answers


@dataclass
class ServiceProxy:
    backends: tuple[Backend, ...]
    poll_s: float = 0.2
    idle_close_s: float = 1.0
    port: int = 0
    connections: dict[str, int] = field(default_factory=dict)  # backend name -> connections handed
    _ready: frozenset[str] = frozenset()
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)
    _sockets: set[socket.socket] = field(default_factory=set)
    _turn: Iterator[int] = field(default_factory=itertools.count)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ready(self) -> frozenset[str]:
        with self._lock:
            return self._ready

    def __enter__(self) -> ServiceProxy:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.port = int(self._listener.getsockname()[1])
        self._refresh()
        for target in (self._poll, self._accept):
            thread = threading.Thread(target=target, daemon=True, name=f"proxy-{target.__name__}")
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    # ------------------------------------------------------------------ internals

    def _refresh(self) -> None:
        ready = set()
        for backend in self.backends:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{backend.ops_url}/readyz", timeout=1).status_code == 200:
                    ready.add(backend.name)
        with self._lock:
            self._ready = frozenset(ready)

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._refresh()

    def _pick(self) -> Backend | None:
        with self._lock:
            ready = [b for b in self.backends if b.name in self._ready]
            if not ready:
                return None
            chosen = ready[next(self._turn) % len(ready)]
            self.connections[chosen.name] = self.connections.get(chosen.name, 0) + 1
            return chosen

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            backend = self._pick()
            upstream = None
            if backend is not None:
                try:
                    upstream = socket.create_connection(("127.0.0.1", backend.port), timeout=2)
                except OSError:
                    upstream = None  # an endpoint not yet removed: the connection fails
            if upstream is None:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            thread = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            thread.start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Copy bytes both ways until either side closes, or the backend answered last and the
        pair has been idle too long since (HTTP/1.1: no request is waiting for its answer)."""
        last, answered = time.monotonic(), True
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([client, upstream], [], [], 0.1)
                if not readable:
                    if answered and time.monotonic() - last > self.idle_close_s:
                        return
                    continue
                for source in readable:
                    data = source.recv(_CHUNK)
                    if not data:
                        return
                    (upstream if source is client else client).sendall(data)
                    answered = source is upstream
                last = time.monotonic()
        except OSError:
            return
        finally:
            with self._lock:
                self._sockets.discard(client)
                self._sockets.discard(upstream)
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
