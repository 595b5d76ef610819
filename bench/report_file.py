"""Rewrite one "## Section" of docs/BENCHMARKS.md, keeping every other section as it was."""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = "# Benchmarks\n\nEvery figure here is produced by a make target from a fresh clone; each section names its command.\n"


def replace_section(path: Path, title: str, body: str) -> None:
    text = path.read_text() if path.exists() else _HEADER
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n")
