"""The seed corpus in `corpus/<target>/`: names, expectations and replay parameters.

Every entry is named `<expect>-<what>.<ext>`:
- `ok-*`: valid input; it must decode (parse) without error;
- `err-*`: invalid input; it must be refused with the documented error and a good message;
- `bug-*`: reproduces a bug listed in `known_bugs.py`; replayed as xfail(strict=True).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.known_bugs import KNOWN_BUGS, bug_for_entry

CORPUS = Path(__file__).parent / "corpus"
EXPECTATIONS = ("ok", "err", "bug")
#: The corpus folders these helpers own (corpus/extender_verbs/ belongs to test_extender_verbs.py).
TARGETS = (
    "topo",
    "quantity",
    "pod-demand",
    "cordons",
    "allocation",
    "consumption",
    "ledger",
    "ledger-config-map",
    "gpu-topology",
    "gpu-topology-status",
)


def entry_paths(target: str) -> list[Path]:
    return sorted(p for p in (CORPUS / target).iterdir() if p.is_file())


def expectation(path: Path) -> str:
    return path.name.split("-", 1)[0]


def replay_params(target: str, escaped: type[BaseException] | tuple[type[BaseException], ...]) -> list[Any]:
    """pytest params (path) for every entry of `target`; `bug-*` entries marked xfail(strict)
    with the reason from known_bugs.py and `escaped` as the failure they must show."""
    params = []
    for path in entry_paths(target):
        bug = bug_for_entry(target, path.name)
        marks = [pytest.mark.xfail(strict=True, raises=escaped, reason=bug.reason)] if bug else []
        params.append(pytest.param(path, id=path.name, marks=marks))
    return params


def read_text(path: Path) -> str:
    """The entry as text, byte for byte (CR LF kept; invalid UTF-8 replaced, as readers of files do)."""
    return path.read_bytes().decode("utf-8", errors="replace")


def read_json(path: Path) -> Any:
    return json.loads(path.read_bytes())


def corpus_problems() -> list[str]:
    """What is wrong with the corpus as a whole: unknown name prefixes, bugs without entries,
    `bug-` entries that are not listed."""
    problems = []
    for target in TARGETS:
        if not (CORPUS / target).is_dir():
            problems.append(f"{target}: no corpus folder")
            continue
        for path in entry_paths(target):
            kind = expectation(path)
            if kind not in EXPECTATIONS:
                problems.append(f"{target}/{path.name}: name must start with ok-, err- or bug-")
            if kind == "bug" and bug_for_entry(target, path.name) is None:
                problems.append(f"{target}/{path.name}: a bug- entry that known_bugs.py does not list")
            if kind != "bug" and bug_for_entry(target, path.name) is not None:
                problems.append(f"{target}/{path.name}: listed in known_bugs.py but not named bug-")
    for bug in KNOWN_BUGS:
        if not (CORPUS / bug.target / bug.corpus).is_file():
            problems.append(f"known bug {bug.target}/{bug.corpus}: no such corpus entry")
    return problems
