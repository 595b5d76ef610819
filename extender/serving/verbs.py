"""The verbs as raw routes over `ExtenderService`: the JSON body in, the JSON answer (bytes) out.

`extender.serving.verbs_server` serves these routes; this module (like the server) imports no HTTP
framework, so the verbs path is ready without FastAPI. `extender.serving.app` wraps the same decoding
(`extender.wire.decode_json`) for its in-process app.
"""

from __future__ import annotations

from collections.abc import Callable

from extender.placing.reuse import Reuse
from extender.service import ExtenderService
from extender.wire import compact_json, decode_json

_ENCODINGS_KEPT = 8  # JSON encodings of answers remembered per verb (a few request kinds at once)


def verb_routes(service: ExtenderService) -> dict[str, Callable[[bytes], bytes]]:
    """The verbs for `extender.serving.verbs_server.VerbsServer`: raw body in, JSON bytes out."""

    def route(fn: Callable[[object], object]) -> Callable[[bytes], bytes]:
        encoded: Reuse[bytes] = Reuse(_ENCODINGS_KEPT)  # answers the service handed out again

        def run(raw: bytes) -> bytes:
            answer = fn(decode_json(raw))
            data = encoded.get(answer)
            if data is None:
                data = encoded.put(answer, compact_json(answer))
            return data

        return run

    return {
        "/filter": service.filter_json,
        "/prioritize": route(service.prioritize),
        "/bind": route(service.bind),
    }
