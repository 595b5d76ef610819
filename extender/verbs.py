"""The verbs as raw routes over `ExtenderService`: the JSON body in, the JSON answer (bytes) out.

`extender.verbs_server` serves these routes; this module (like the server) imports no HTTP
framework, so the verbs path is ready without FastAPI. `extender.app` wraps the same decoding
for its in-process app.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from extender.service import ExtenderService


def decode_body(raw: bytes) -> object:
    """The JSON body, or None when it is not JSON (the verbs then answer with a clear Error)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def encode_answer(answer: object) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode()


def verb_routes(service: ExtenderService) -> dict[str, Callable[[bytes], bytes]]:
    """The verbs for `extender.verbs_server.VerbsServer`: raw body in, JSON bytes out."""

    def route(fn: Callable[[object], object]) -> Callable[[bytes], bytes]:
        last: list[tuple[object, bytes]] = []  # the last answer object and its encoding

        def run(raw: bytes) -> bytes:
            answer = fn(decode_body(raw))
            seen = last[-1] if last else None
            if seen is not None and seen[0] is answer:  # the service handed out the same answer
                return seen[1]
            data = encode_answer(answer)
            last[:] = [(answer, data)]
            return data

        return run

    return {
        "/filter": route(service.filter),
        "/prioritize": route(service.prioritize),
        "/bind": route(service.bind),
    }
