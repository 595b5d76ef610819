"""Bugs the fuzzers found in `topology/` and `contract/` that are not fixed yet.

Each one has a corpus entry (`corpus/<target>/<corpus>`) that reproduces it; the replay tests
mark that entry `xfail(strict=True)`, so the fix makes it pass and fails the run until the entry
is moved out of this list (rename it `ok-`/`err-` as it then behaves). While a bug is listed,
the random fuzz tests skip inputs that fail *exactly* this way (same target, same escaping
type, message or traceback matching `detail`) and count them as a hypothesis event, so that
one known bug does not hide every other finding behind the same failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownBug:
    target: str  # the corpus folder: topo, quantity, allocation, ...
    corpus: str  # the reproducing entry in corpus/<target>/
    escapes: tuple[str, ...]  # what escaped: "builtins.ValueError", "hung", "message" (a bad message)
    detail: str  # regex searched in the escaped exception's message and traceback
    reason: str


_INT_DIGITS = r"Exceeds the limit \(4300 digits\) for integer string conversion"
_NOT_DECIMAL = r"Invalid literal for Fraction|invalid literal for int\(\) with base 10"

KNOWN_BUGS: tuple[KnownBug, ...] = ()


def known_bug(target: str, escaped: str, text: str) -> KnownBug | None:
    """The listed bug that explains `escaped` (a type name, "hung" or "message") with `text`."""
    for bug in KNOWN_BUGS:
        if bug.target == target and escaped in bug.escapes and re.search(bug.detail, text):
            return bug
    return None


def bug_for_entry(target: str, name: str) -> KnownBug | None:
    """The listed bug a corpus entry reproduces, if any."""
    return next((b for b in KNOWN_BUGS if b.target == target and b.corpus == name), None)
