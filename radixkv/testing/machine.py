"""The conformance state machine: drive any prefix cache, compare it with a page-set model.

The model is the set of cached pages (``{(namespace, tokens): block}``) plus
the locks the machine holds. Every rule calls the cache, then reads
``contents()`` and checks that the change is one the contract allows
(:class:`~radixkv.testing.protocol.PrefixCacheUnderTest`): a match changes
nothing, an insert adds only the pages it was given, evictions drop only
unprotected pages and exactly as many as asked, blocks are never shared.
Eviction *order* is left to the cache's policy; everything else is pinned.

>>> from radixkv import PrefixCache
>>> from radixkv.testing import RadixKVTarget, run_conformance
>>> run_conformance(lambda: RadixKVTarget(PrefixCache(num_blocks=6, page_size=2)),
...                 max_examples=5)
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Set, Tuple, Type

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from .protocol import PageKey, PrefixCacheUnderTest
from .strategies import token_lists


def make_state_machine(
    factory: Callable[[], PrefixCacheUnderTest],
    *,
    namespaces: Sequence[Optional[Hashable]] = (None, "a"),
    alphabet: int = 3,
    max_pages: int = 4,
    exact_eviction: bool = True,
    admits_everything: bool = False,
    loads_on_match: bool = False,
) -> Type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` class that checks the cache ``factory()`` builds.

    Args:
        factory: builds a fresh cache for each test case.
        namespaces: namespaces requests are drawn from.
        alphabet: distinct token values (small = more shared prefixes).
        max_pages: longest sequence, in pages (plus up to a page of tail).
        exact_eviction: require ``evict(n)`` to drop exactly
            ``min(n, unprotected pages)`` (turn off for caches that may stop early).
        admits_everything: require ``insert`` to cache every new page
            (turn off for policies with admission control).
        loads_on_match: the cache has lower tiers that ``match`` loads pages
            back from (:class:`~radixkv.tiers.TieredCache`): a match may then
            return more pages than ``contents()`` held, provided they appear in
            ``contents()`` with the returned blocks (evicting at most as many).

    Use ``make_state_machine(...).TestCase`` as a unittest/pytest test class,
    or :func:`run_conformance`.
    """

    class PrefixCacheMachine(RuleBasedStateMachine):
        sequences = Bundle("sequences")

        def __init__(self) -> None:
            super().__init__()
            self.cache = factory()
            self.page_size = int(self.cache.page_size)
            self.model: Dict[PageKey, int] = dict(self.cache.contents())
            self.locks: List[Tuple[Any, Optional[Hashable], Tuple[int, ...]]] = []

        # -------------------------------------------------------- model helpers
        def _longest(self, tokens: Sequence[int], namespace: Optional[Hashable]) -> List[int]:
            blocks = []
            p = self.page_size
            for end in range(p, len(tokens) + 1, p):
                block = self.model.get((namespace, tuple(tokens[:end])))
                if block is None:
                    break
                blocks.append(block)
            return blocks

        def _protected(self) -> Set[PageKey]:
            p = self.page_size
            out: Set[PageKey] = set()
            for _, namespace, prefix in self.locks:
                for end in range(p, len(prefix) + 1, p):
                    out.add((namespace, prefix[:end]))
            return out

        def _observe(self, what: str, *, max_dropped: int = 0, exact_dropped: Optional[int] = None,
                     added: Optional[Dict[PageKey, int]] = None) -> int:
            """Read contents(), check the change since the model, adopt it; return pages dropped."""
            new = dict(self.cache.contents())
            old = self.model
            for key, block in new.items():
                if key in old and old[key] != block:
                    raise AssertionError(f"{what}: page {key} moved from block {old[key]} to {block}")
            dropped = [key for key in old if key not in new]
            appeared = {key: new[key] for key in new if key not in old}
            allowed = added or {}
            unexpected = {k: v for k, v in appeared.items() if allowed.get(k) != v}
            assert not unexpected, f"{what}: pages appeared that were not inserted: {unexpected}"
            lost = self._protected().intersection(dropped)
            assert not lost, f"{what}: locked pages were dropped: {sorted(lost, key=str)}"
            if exact_dropped is not None:
                assert len(dropped) == exact_dropped, (
                    f"{what}: dropped {len(dropped)} pages, expected {exact_dropped}")
            else:
                assert len(dropped) <= max_dropped, (
                    f"{what}: dropped {len(dropped)} pages, at most {max_dropped} allowed")
            self.model = new
            return len(dropped)

        def _match(self, tokens: List[int], namespace: Optional[Hashable]):
            p = self.page_size
            expected = self._longest(tokens, namespace)
            m = self.cache.match(tokens, namespace=namespace)
            got = [int(b) for b in m.blocks]
            loaded = got[len(expected):] if loads_on_match and got[: len(expected)] == expected else []
            assert m.num_tokens == len(got) * p and got == expected + loaded, (
                f"match({tokens}, namespace={namespace!r}) returned {m.num_tokens} tokens in "
                f"blocks {got}; cached pages say {len(expected) * p} tokens in {expected}")
            added = {(namespace, tuple(tokens[: (len(expected) + i + 1) * p])): b for i, b in enumerate(loaded)}
            self._observe("match", max_dropped=len(loaded), added=added)
            for key in added:
                assert key in self.model, f"match returned page {key} loaded back but not cached"
            return m

        # -------------------------------------------------------- rules
        @initialize()
        def empty_at_start(self) -> None:
            assert self.model == {}, f"a new cache already holds pages: {self.model}"

        @rule(target=sequences, tokens=token_lists(alphabet=alphabet, max_size=max_pages * 2 + 1))
        def new_sequence(self, tokens: List[int]) -> List[int]:
            return tokens

        @rule(target=sequences, base=sequences, suffix=token_lists(alphabet=alphabet, max_size=4))
        def extend(self, base: List[int], suffix: List[int]) -> List[int]:
            limit = max_pages * self.page_size + self.page_size - 1
            return (base + suffix)[:limit]

        @rule(tokens=sequences, namespace=st.sampled_from(list(namespaces)))
        def match(self, tokens: List[int], namespace: Optional[Hashable]) -> None:
            self._match(tokens, namespace)

        @rule(tokens=sequences, namespace=st.sampled_from(list(namespaces)))
        def lock_match(self, tokens: List[int], namespace: Optional[Hashable]) -> None:
            m = self._match(tokens, namespace)
            self.cache.lock(m.node)
            self.locks.append((m.node, namespace, tuple(tokens[: m.num_tokens])))
            self._observe("lock")

        @precondition(lambda self: self.locks)
        @rule(index=st.integers(0, 1 << 16))
        def unlock(self, index: int) -> None:
            handle, _, _ = self.locks.pop(index % len(self.locks))
            self.cache.unlock(handle)
            self._observe("unlock")

        @rule(tokens=sequences, namespace=st.sampled_from(list(namespaces)))
        def unlock_without_lock(self, tokens: List[int], namespace: Optional[Hashable]) -> None:
            m = self._match(tokens, namespace)
            prefix = tuple(tokens[: m.num_tokens])
            held = Counter((ns, pre) for _, ns, pre in self.locks)
            if held[(namespace, prefix)]:
                return
            try:
                self.cache.unlock(m.node)
            except ValueError:
                pass
            else:
                raise AssertionError(f"unlock of a handle holding no lock ({prefix}, {namespace!r}) did not raise")
            self._observe("failed unlock")

        @rule(tokens=sequences, namespace=st.sampled_from(list(namespaces)), fresh=st.booleans())
        def insert(self, tokens: List[int], namespace: Optional[Hashable], fresh: bool) -> None:
            p = self.page_size
            m = self._match(tokens, namespace)
            hit = m.num_tokens // p
            self.cache.lock(m.node)
            self.locks.append((m.node, namespace, tuple(tokens[: m.num_tokens])))
            try:
                num_pages = len(tokens) // p
                need = num_pages if fresh else num_pages - hit
                room = self.cache.num_blocks - len(self._protected())
                blocks = self.cache.allocate(need)
                if blocks is None:
                    assert need > room, (
                        f"allocate({need}) returned None with {room} blocks free or unprotected")
                    self._observe("failed allocate")
                    return
                blocks = [int(b) for b in blocks]
                assert len(blocks) == need, f"allocate({need}) returned {len(blocks)} blocks"
                assert len(set(blocks)) == need, f"allocate({need}) returned duplicates: {blocks}"
                assert all(0 <= b < self.cache.num_blocks for b in blocks), f"allocate returned {blocks}"
                self._observe(f"allocate({need})", max_dropped=need)
                cached = set(self.model.values())
                reused = cached.intersection(blocks)
                assert not reused, f"allocate({need}) returned blocks still cached: {sorted(reused)}"
                passed = blocks if fresh else [int(b) for b in m.blocks] + blocks
                expected_present = len(self._longest(tokens, namespace))
                present = self.cache.insert(tokens, passed, namespace=namespace)
                assert present == expected_present, (
                    f"insert returned {present} pages already cached, expected {expected_present}")
                offered = {(namespace, tuple(tokens[: (i + 1) * p])): passed[i]
                           for i in range(present, num_pages)}
                self._observe("insert", added=offered)
                kept = [i for i in range(present, num_pages) if (namespace, tuple(tokens[: (i + 1) * p])) in self.model]
                assert kept == list(range(present, present + len(kept))), (
                    f"insert kept new pages {kept}, not a leading run from page {present}")
                if admits_everything:
                    assert len(kept) == num_pages - present, (
                        f"insert cached {len(kept)} of {num_pages - present} new pages")
            finally:
                self.locks.pop()
                self.cache.unlock(m.node)
            self._observe("unlock after insert")

        @rule(n=st.integers(0, 8))
        def evict(self, n: int) -> None:
            evictable = len(self.model) - len(self._protected().intersection(self.model))
            freed = self.cache.evict(n)
            assert 0 <= freed <= n, f"evict({n}) returned {freed}"
            self._observe(f"evict({n})", exact_dropped=freed)
            if exact_eviction:
                assert freed == min(n, evictable), (
                    f"evict({n}) freed {freed} pages with {evictable} unprotected cached")

        # -------------------------------------------------------- invariants
        @invariant()
        def consistent(self) -> None:
            self.cache.check()
            assert dict(self.cache.contents()) == self.model, "contents() changed outside any call"
            blocks = list(self.model.values())
            assert len(set(blocks)) == len(blocks), (
                f"a block holds two pages: {[b for b, c in Counter(blocks).items() if c > 1]}")
            assert all(0 <= b < self.cache.num_blocks for b in blocks), f"block out of range in {blocks}"
            p = self.page_size
            for namespace, tokens in self.model:
                assert len(tokens) % p == 0 and tokens, f"page key {tokens} is not whole pages"
                if len(tokens) > p:
                    assert (namespace, tokens[:-p]) in self.model, (
                        f"page {tokens} of {namespace!r} is cached but its predecessor is not")

        def teardown(self) -> None:
            failing = sys.exc_info()[0] is not None  # do not mask the failure being reported
            while self.locks:
                handle, _, _ = self.locks.pop()
                try:
                    self.cache.unlock(handle)
                except Exception:
                    if not failing:
                        raise

    return PrefixCacheMachine


def conformance_settings(max_examples: int = 100, step_count: int = 30) -> settings:
    """Settings for a conformance run: no deadline, one (shrunk) failure reported, ``max_examples`` cases."""
    return settings(max_examples=max_examples, stateful_step_count=step_count, deadline=None,
                    report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def run_conformance(factory: Callable[[], PrefixCacheUnderTest], *, max_examples: int = 100,
                    step_count: int = 30, **options: Any) -> None:
    """Run the conformance state machine on caches from ``factory``; raises with a shrunk example on a bug.

    ``options`` go to :func:`make_state_machine`.
    """
    machine = make_state_machine(factory, **options)
    run_state_machine_as_test(machine, settings=conformance_settings(max_examples, step_count))
