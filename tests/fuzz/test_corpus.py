"""The seed corpus as a whole agrees with known_bugs.py (see corpus_support.py for the naming)."""

from __future__ import annotations

import pytest

from tests.fuzz.corpus_support import corpus_problems


@pytest.mark.timeout(120)
def test_corpus_is_consistent_with_the_known_bugs() -> None:
    """Every entry is named ok-/err-/bug-, every bug- entry is a listed bug, and every listed bug has its entry."""
    assert corpus_problems() == []
