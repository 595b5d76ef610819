"""The cyclic collector paused around a relist: back on after the last pause, left off if it was."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from extender.kube.gc_pause import collector_paused

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_inside_and_on_after() -> None:
    """One pause: off inside, on again after."""
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_pauses_end_with_the_outermost() -> None:
    """A pause inside a pause does not turn the collector back on when it ends."""
    gc.enable()
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_still_turns_the_collector_back_on() -> None:
    """The pause ends (and the collector is back on) when the body raises."""
    gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("relist failed")
    assert gc.isenabled()


def test_a_collector_turned_off_by_someone_else_stays_off() -> None:
    """Off before the pause: still off after it."""
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_pauses_in_two_threads_end_with_the_last() -> None:
    """Two watches relisting at once: the collector stays off until both are done."""
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def relist() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    other = threading.Thread(target=relist)
    with collector_paused():
        other.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's pause is still running
    release.set()
    other.join(10)
    assert gc.isenabled()


class _Ring:
    """An object in a reference cycle with itself."""

    def __init__(self) -> None:
        self.me = self


def test_what_a_pause_made_ages_at_once_and_its_cycles_are_still_collected() -> None:
    """Objects made during a pause are in the oldest generation when it ends (the young ones are
    empty, so the next young collections walk nothing of the relist), and a cycle made then is
    freed by the next full collection."""
    gc.enable()
    with collector_paused():
        kept = [[i] for i in range(1000)]
        ring = _Ring()
    assert gc.get_count()[0] == 0
    young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
    assert id(kept[0]) not in young and id(kept) not in young
    alive = {id(o) for o in gc.get_objects(generation=2)}
    assert id(kept[0]) in alive and id(ring) in alive
    gone = id(ring)
    del ring
    gc.collect()
    assert gone not in {id(o) for o in gc.get_objects()}
