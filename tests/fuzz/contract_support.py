"""What the `contract` decoders promise, and JSON-ish inputs to test that with.

Every decoder either returns a value or raises its documented error (AllocationError,
LedgerError, GpuTopologyError, PodSpecError, QuantityError) with a message that names where the
input is wrong; nothing else may escape. `decode_checked` runs one call and turns a broken
promise into a ContractViolation; `mutations` changes one place of a valid encoding and says
where, so a test can demand that the error names that place.
"""

from __future__ import annotations

import copy
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import event
from hypothesis import strategies as st

from tests.fuzz.known_bugs import known_bug

T = TypeVar("T")
Path = tuple[str | int, ...]


class ContractViolation(AssertionError):
    """A decoder let an undocumented exception escape (`escaped` is its type, module-qualified),
    or raised its documented error with a message that does not say where (`escaped` = "message")."""

    def __init__(self, escaped: str, detail: str) -> None:
        super().__init__(f"{escaped}: {detail}")
        self.escaped = escaped


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def decode_checked(
    call: Callable[[], T],
    documented: type[Exception],
    message_problem: Callable[[str], str | None],
    shown_input: Any,
) -> tuple[T | None, Exception | None]:
    """(value, None) when `call` returns, (None, error) when it raises `documented` with a good
    message (`message_problem` returns None); raises ContractViolation otherwise."""
    try:
        return call(), None
    except documented as exc:
        problem = message_problem(str(exc))
        if problem:
            raise ContractViolation(
                "message", f"{type(exc).__name__}({str(exc)!r}) {problem}; input {_short(shown_input)}"
            ) from exc
        return None, exc
    except Exception as exc:
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        trace = "".join(traceback.format_exception(exc))[-3000:]
        raise ContractViolation(kind, f"{exc}; input {_short(shown_input)}\n{trace}") from exc


def tolerating_known_bugs(target: str, check: Callable[[], T]) -> T | None:
    """`check()`, except that a violation listed in known_bugs.py becomes a hypothesis event."""
    try:
        return check()
    except ContractViolation as violation:
        bug = known_bug(target, violation.escaped, str(violation))
        if bug is None:
            raise
        event(f"known bug: {bug.corpus}")
        return None


def names_path(message: str, path: Path) -> bool:
    """True when every key of `path` and every index (as `[i]`) appears in `message`."""
    return all((f"[{part}]" if isinstance(part, int) else str(part)) in message for part in path)


def render_path(path: Path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


# ---------------------------------------------------------------------- JSON-ish values

#: Field names of every encoding, so random objects hit the keys the decoders read.
FIELD_NAMES = (
    "schema", "node", "generation", "enforcement", "resources", "gpus", "index", "uuid", "whole",
    "memoryMiB", "units", "migUuid", "containers", "deviceIds", "entries", "podUid", "namespace",
    "name", "reservedAt", "allocation", "ledger", "metadata", "resourceVersion", "data", "spec",
    "status", "gpuHealth", "healthy", "reason", "since", "severity", "cordoned", "gpuCount",
    "agentVersion", "mps", "active", "cordonProblems", "heartbeat", "schemaVersion", "links", "nics",
    "nicLinks", "nvswitch", "sources", "warnings", "contentHash", "initContainers", "restartPolicy",
    "limits", "requests",
)  # fmt: skip
ODD_STRINGS = (
    "", " ", "0", "-1", "1.5", "1e3", "1e400", "NaN", "Infinity", "-0", "\u00b2", "\u0663", "\uff11",
    "1e+-5", "1Ki", "500m", "0.5", "Always", "true", "null", "{}", "[]", "\x00", "\ud800", "\U0001f600",
    "linkpack.io/allocation/v1", "linkpack.io/consumed/v1", "linkpack.io/ledger/v1",
    "linkpack.io/topology/v1", "GPU-00000000-0000-0000-0000-000000000000", "MIG-0", "none", "mps", "mig",
)  # fmt: skip
keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=8)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=16),
    st.sampled_from(ODD_STRINGS),
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=16,
)

_KIND_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "bool": st.booleans(),
    "int": st.integers() | st.integers(-(2**70), 2**70),
    "float": st.floats(),
    "str": st.text(max_size=16) | st.sampled_from(ODD_STRINGS),
    "list": st.lists(scalars, max_size=3),
    "dict": st.dictionaries(keys, scalars, max_size=3),
}


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("str", str), ("list", list)):
        if isinstance(value, kind):
            return name
    return "dict"


def positions(doc: Any, prefix: Path = ()) -> list[Path]:
    """Every place in a JSON document (the root included), depth first."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += positions(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += positions(value, (*prefix, index))
    return found


def _get(doc: Any, path: Path) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


@dataclass(frozen=True)
class Mutation:
    """One change to a valid document: `op` at `path`. For "retype" the value there was replaced
    by one of another JSON type, so the decoder must name `path` if it refuses the document."""

    doc: Any
    path: Path
    op: str


MUTATION_OPS = ("retype", "replace", "delete", "insert", "wrap", "duplicate")


@st.composite
def mutations(draw: st.DrawFn, doc: Any, ops: tuple[str, ...] = MUTATION_OPS, root: bool = True) -> Mutation:
    """One `op` at one place of `doc` (a copy); `root=False` keeps the document itself an object,
    for decoders whose signature promises a mapping."""
    doc = copy.deepcopy(doc)
    places = positions(doc) if root else positions(doc)[1:]
    path = places[draw(st.integers(0, len(places) - 1))]
    op = draw(st.sampled_from(ops))
    current = _get(doc, path)
    if op == "retype":
        kind = draw(st.sampled_from(sorted(set(_KIND_STRATEGIES) - {json_kind(current)})))
        return Mutation(_set(doc, path, draw(_KIND_STRATEGIES[kind])), path, op)
    if op == "delete" and path:
        parent = _get(doc, path[:-1])
        del parent[path[-1]]
        return Mutation(doc, path, op)
    if op == "insert" and isinstance(current, (dict, list)):
        if isinstance(current, dict):
            current[draw(keys)] = draw(json_values)
        else:
            current.insert(draw(st.integers(0, len(current))), draw(json_values))
        return Mutation(doc, path, op)
    if op == "wrap":
        wrapped = draw(st.sampled_from(["list", "dict"]))
        return Mutation(_set(doc, path, [current] if wrapped == "list" else {"value": current}), path, op)
    if op == "duplicate" and isinstance(current, list) and current:
        current.append(copy.deepcopy(current[draw(st.integers(0, len(current) - 1))]))
        return Mutation(doc, path, op)
    return Mutation(_set(doc, path, draw(json_values)), path, "replace")


# ---------------------------------------------------------------------- JSON text


@st.composite
def mutated_json_text(draw: st.DrawFn, text: str) -> str:
    """A valid JSON text damaged the way a corrupted annotation or a hostile writer would: flipped
    or deleted characters, truncation, huge numbers, deep nesting, unicode, stray bytes."""
    for op in draw(st.lists(st.sampled_from(_TEXT_OPS), min_size=1, max_size=3)):
        at = draw(st.integers(0, len(text)))
        if op == "flip" and text:
            at = min(at, len(text) - 1)
            text = (
                text[:at] + draw(st.sampled_from('{}[]",:0-9.eE+-\\ tfn') | st.characters()) + text[at + 1 :]
            )
        elif op == "truncate":
            text = text[:at]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        elif op == "insert":
            text = text[:at] + draw(st.text(max_size=8) | st.sampled_from(ODD_STRINGS)) + text[at:]
        elif op == "huge_number":  # an existing number made huge
            numbers = list(re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text))
            huge = draw(st.sampled_from(["9" * 5000, "1" + "0" * 400, "1e999", "-0.0e-999", "1" * 4301]))
            if numbers:
                found = numbers[draw(st.integers(0, len(numbers) - 1))]
                text = text[: found.start()] + huge + text[found.end() :]
        elif op == "deep_nesting":  # deeply nested arrays or objects where a value starts
            depth = draw(st.sampled_from([10, 999, 1000, 1001, 5000]))
            nest = draw(st.sampled_from(["[" * depth + "]" * depth, '{"a":' * depth + "0" + "}" * depth]))
            starts = [m.end() for m in re.finditer(r"[:\[]", text)] or [0]
            at = starts[draw(st.integers(0, len(starts) - 1))]
            text = text[:at] + nest + text[at:]
        elif op == "whitespace":
            text = text[:at] + draw(st.sampled_from([" ", "\n", "\t", "\u00a0", "\ufeff"])) + text[at:]
    return text


_TEXT_OPS = ("flip", "truncate", "delete", "insert", "huge_number", "deep_nesting", "whitespace")
