"""HTTP endpoints of the node agent on its metrics port.

- GET /metrics: Prometheus exposition of `AgentMetrics`;
- GET /healthz: 200 "ok" while the agent loop polls, 503 "stalled" otherwise;
- GET /debug/state: the discovered topology, its sources and warnings, and the status (JSON);
- POST /debug/inject (simulate mode only, 404 otherwise): one JSON fault command applied to
  the simulated NVML, e.g. `{"gpu": 3, "xid": 79}`; a bad command gets 400 with the help text.

It knows the agent only as an `AgentView`, so it depends on nothing above it.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from node_agent.metrics import AgentMetrics
from node_agent.sources.nvml_simulated import FAULT_COMMAND_HELP, FaultCommandError, SimulatedNvml

log = logging.getLogger(__name__)


class AgentView(Protocol):
    """What the endpoints read from the agent."""

    @property
    def metrics(self) -> AgentMetrics: ...

    def stalled(self) -> bool:
        """The agent loop has not polled for a while."""
        ...

    def state(self) -> dict[str, Any]:
        """The discovered topology, its sources and warnings, and the status (JSON-ready)."""
        ...


def serve_http(
    agent: AgentView, simulated: SimulatedNvml | None, host: str, port: int
) -> ThreadingHTTPServer:
    """Start the metrics / health / debug server on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, ctype = agent.metrics.render()
                self._reply(200, body, ctype)
            elif self.path == "/healthz":
                stalled = agent.stalled()
                self._reply(503 if stalled else 200, b"stalled\n" if stalled else b"ok\n", "text/plain")
            elif self.path == "/debug/state":
                self._json(200, agent.state())
            else:
                self._reply(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:
            if self.path != "/debug/inject" or simulated is None:
                self._reply(404, b"fault injection exists only with --simulate\n", "text/plain")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                command = json.loads(self.rfile.read(length) or b"null")
                if not isinstance(command, dict):
                    raise FaultCommandError("expected a JSON object")
                self._json(200, {"applied": simulated.apply_fault(command)})
            except (FaultCommandError, ValueError) as exc:
                self._json(400, {"error": str(exc), "help": FAULT_COMMAND_HELP})

        def _json(self, code: int, doc: object) -> None:
            self._reply(code, json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n", "application/json")

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="agent-http", daemon=True).start()
    return server
