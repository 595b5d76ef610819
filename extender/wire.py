"""kube-scheduler's extender wire format (k8s.io/kube-scheduler/extender/v1), in and out.

The Go structs have no json tags, so keys are the capitalised field names; Go decodes keys
case-insensitively, and so do we. Requests become frozen values here; answers are built here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_EXTENDER_PRIORITY = 10


class WireError(ValueError):
    """The body is not an extender request; the message names the missing or wrong key."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Body of filter and prioritize. `node_names` is set with nodeCacheCapable, else `nodes`."""

    pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any], ...] | None  # full Node objects (nodeCacheCapable: false)


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def _folded(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise WireError("request body must be a JSON object")
    return {str(k).lower(): v for k, v in body.items()}


def parse_extender_args(body: object) -> ExtenderArgs:
    doc = _folded(body)
    pod = doc.get("pod")
    if not isinstance(pod, dict):
        raise WireError("'Pod' must be a Pod object")
    names = doc.get("nodenames")
    node_list = doc.get("nodes")
    if names is not None:
        if not isinstance(names, list) or not _all_strings(names):
            raise WireError("'NodeNames' must be a list of strings")
        return ExtenderArgs(pod, tuple(names), None)
    if isinstance(node_list, dict):
        items = node_list.get("items") or []
        if not isinstance(items, list):
            raise WireError("'Nodes.items' must be a list")
        nodes = tuple(i for i in items if isinstance(i, dict))
        node_names = []
        for position, node in enumerate(nodes):
            meta = node.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise WireError(f"'Nodes.items[{position}].metadata.name' must be a node name")
            node_names.append(name)
        return ExtenderArgs(pod, tuple(node_names), nodes)
    raise WireError("neither 'NodeNames' nor 'Nodes' was given")


def _all_strings(items: list[Any]) -> bool:
    try:
        "".join(items)  # one pass in C; raises on the first item that is not a string
    except TypeError:
        return False
    return True


def parse_binding_args(body: object) -> BindingArgs:
    doc = _folded(body)
    missing = [k for k in ("PodName", "PodNamespace", "Node") if not isinstance(doc.get(k.lower()), str)]
    if missing:
        raise WireError(f"bind request lacks {', '.join(missing)}")
    return BindingArgs(doc["podname"], doc["podnamespace"], str(doc.get("poduid") or ""), doc["node"])


def filter_result(
    args: ExtenderArgs,
    passed: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult in the mode the scheduler asked in (names, or full Node objects)."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }
    if args.nodes is None:
        result["NodeNames"] = list(passed)
    else:
        keep = set(passed)
        result["Nodes"] = {
            "metadata": {},
            "items": [n for n in args.nodes if (n.get("metadata") or {}).get("name") in keep],
        }
    return result


def priority_list(scores: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"Host": host, "Score": max(0, min(MAX_EXTENDER_PRIORITY, score))} for host, score in scores]


def priority_list_for(names: Sequence[str], scores: Mapping[str, int]) -> list[dict[str, Any]]:
    """HostPriorityList for `names` in their order; a name without a score gets 0. The same as
    `priority_list`, built in one pass (prioritize answers have thousands of entries)."""
    clamped = {
        n: max(0, min(MAX_EXTENDER_PRIORITY, s))
        for n, s in scores.items()
        if not 0 <= s <= MAX_EXTENDER_PRIORITY
    }
    scored = {**scores, **clamped} if clamped else scores
    return [{"Host": n, "Score": scored.get(n, 0)} for n in names]


def binding_result(error: str = "") -> dict[str, str]:
    return {"Error": error}


def decode_json(raw: bytes) -> object:
    """The JSON body, or None when it is not JSON (the verbs then answer with a clear Error)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def compact_json(answer: object) -> bytes:
    """An answer as it goes on the wire: compact JSON, non-ASCII escaped."""
    return json.dumps(answer, separators=(",", ":")).encode()


def string_map_entries(mapping: Mapping[str, str]) -> str:
    """The entries of a JSON object of strings as `compact_json` writes them, without the braces."""
    return json.dumps(mapping, separators=(",", ":"))[1:-1]


def filter_result_json(passed: Sequence[str], failed: str, unresolvable: str) -> bytes:
    """`compact_json(filter_result(...))` for a names request with no error, from the entries of
    FailedNodes and of FailedAndUnresolvableNodes as `string_map_entries` writes them: answers
    with thousands of failed nodes reuse entries encoded once instead of encoding every entry for
    every call."""
    return (
        '{"Nodes":null,"NodeNames":'
        + json.dumps(list(passed), separators=(",", ":"))
        + ',"FailedNodes":{'
        + failed
        + '},"FailedAndUnresolvableNodes":{'
        + unresolvable
        + '},"Error":""}'
    ).encode()
