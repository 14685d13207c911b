"""The conformance kit's options for real caches' semantics, its request rules, and its per-target example database."""

from __future__ import annotations

import pytest
from hypothesis import Phase
from hypothesis.database import InMemoryExampleDatabase

from radixkv.testing import Match, Target, conformance_settings, run_conformance

from .test_testing_kit import EvictsLockedPages, FlatCache

FIND = conformance_settings(300, phases=[Phase.generate])  # catching only: no shrinking


class CapsHits(FlatCache):
    """Recomputes the last prompt token, as SGLang and vLLM do: a hit is at most len - 1 tokens."""

    def match(self, tokens, *, namespace=None):
        tokens = list(tokens)
        m = super().match(tokens[: max(0, len(tokens) - 1)], namespace=namespace)
        return Match(m.num_tokens, m.blocks, m.node)


class EvictsWholeRuns(FlatCache):
    """Evicts one page more than asked whenever it can (whole-node eviction)."""

    def evict(self, n):
        return super().evict(n + 1) if n else 0


class ReservesBlockZero(FlatCache):
    """Never hands out block 0: ids run 1..num_blocks."""

    def __init__(self, num_blocks, page_size):
        super().__init__(num_blocks, page_size)
        self.free_ids = [b + 1 for b in self.free_ids]

    def check(self):
        assert 0 not in self.held and 0 not in self.pages.values() and 0 not in self.free_ids
        super().check()


class LeaksAbortedBlocks(FlatCache):
    """Broken on purpose: free() forgets the blocks (an aborted request's blocks never come back)."""

    def free(self, blocks):
        self.held.difference_update(blocks)


@pytest.mark.parametrize("cache, option", [
    (CapsHits, {"max_hit": lambda n: n - 1}),
    (EvictsWholeRuns, {"over_eviction": True}),
    (ReservesBlockZero, {"reserved_blocks": (0,)}),
])
def test_an_option_admits_a_cache_the_strict_machine_rejects(cache, option):
    with pytest.raises(AssertionError):
        run_conformance(lambda: cache(6, 2), settings=FIND, database=None)
    run_conformance(Target(lambda: cache(6, 2), cache.__name__, option), max_examples=40, database=None)


def test_an_aborted_requests_leaked_blocks_are_caught():
    with pytest.raises(AssertionError) as info:
        run_conformance(lambda: LeaksAbortedBlocks(6, 2), settings=FIND, database=None)
    assert "check" in "".join(str(f) for f in info.traceback) or "assert" in str(info.value)


def test_lazy_eviction_never_calls_evict():
    class NoEvict(FlatCache):
        """Evicts only inside allocate, as vLLM's free queue does."""

        def allocate(self, n):
            self.allocating = True
            try:
                return super().allocate(n)
            finally:
                self.allocating = False

        def evict(self, n):
            assert getattr(self, "allocating", False), "evict called from outside allocate"
            return super().evict(n)

    run_conformance(lambda: NoEvict(6, 2), max_examples=30, database=None, lazy_eviction=True)


def test_examples_are_saved_per_target_and_replay_only_on_it():
    db = InMemoryExampleDatabase()
    broken = Target(lambda: EvictsLockedPages(4, 2), "EvictsLockedPages(4, 2)")
    with pytest.raises(AssertionError):
        run_conformance(broken, settings=conformance_settings(200, phases=[Phase.generate]), database=db)
    assert db.data and all(key.startswith(b"EvictsLockedPages(4, 2)\0") for key in db.data), list(db.data)
    saved = {k: set(v) for k, v in db.data.items()}
    # Another target with the same machine reads none of it and passes.
    run_conformance(Target(lambda: FlatCache(4, 2), "FlatCache(4, 2)"), max_examples=20, database=db)
    assert {k: set(v) for k, v in db.data.items() if k.startswith(b"EvictsLockedPages")} == saved
    # The broken target replays its saved example first: caught again at once.
    with pytest.raises(AssertionError):
        run_conformance(broken, settings=conformance_settings(1, phases=[Phase.reuse]), database=db)
