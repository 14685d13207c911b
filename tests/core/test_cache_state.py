"""The core state machine: every public operation, against a dict model of what is cached.

It runs once per registered eviction policy (new policies get it for free):
whatever a policy ranks, pages under an unreleased admission, a lock or a pin
never disappear, matches agree with the model, payloads read back as written,
and ``check()`` passes after every step.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixkv import LockError, PrefixCache, StaleHandleError
from radixkv.policies import available

from ..strategies import cached_pages, longest_cached, payload_for, snapshot

KV_SHAPE = (2, 3)


class CacheMachine(RuleBasedStateMachine):
    """Drives a PrefixCache with payloads; the model is the set of cached pages with their blocks
    and payloads. Evictions are observed (the cache may drop unprotected pages at will), and
    everything else is predicted."""

    policy_name = "lru"
    sequences = Bundle("sequences")

    @initialize(page_size=st.integers(1, 3), num_blocks=st.integers(1, 12),
                namespaced=st.booleans())
    def setup(self, page_size, num_blocks, namespaced):
        self.cache = PrefixCache(num_blocks=num_blocks, page_size=page_size, policy=self.policy_name,
                                 kv_shape=KV_SHAPE, dtype="float32")
        self.P = page_size
        self.namespaces = [None, "tenant-b"] if namespaced else [None]
        self.pages = {}          # (ns, prefix) -> block
        self.admissions = []     # (admission, ns, tokens)
        self.locks = []          # (handle, ns, tokens)
        self.held = []           # blocks allocated, not inserted or freed
        self.pins = []           # pinned token prefixes (whole pages), namespace None
        self.evicted_before = 0

    # -------------------------------------------------------------- helpers
    def _expected(self, tokens, ns):
        return longest_cached(self.pages, tokens, self.P, ns)

    def _write_new(self, tokens, ns, start_page, blocks):
        for i, block in enumerate(blocks):
            key = tuple(tokens[: (start_page + i + 1) * self.P])
            self.cache.write([block], payload_for(key, (1, self.P) + KV_SHAPE))

    def _assert_payload(self, tokens, blocks):
        if len(blocks):
            data = self.cache.read(blocks)
            for i in range(len(blocks)):
                key = tuple(tokens[: (i + 1) * self.P])
                np.testing.assert_array_equal(data[i], payload_for(key, (1, self.P) + KV_SHAPE)[0])

    def _sync(self):
        """Pages may only disappear by eviction; adopt the cache's view after checking that."""
        actual = cached_pages(self.cache)
        for key, block in actual.items():
            assert self.pages.get(key) == block, f"page {key} appeared or moved to block {block}"
        self.pages = actual

    def _adopt(self, tokens, ns, blocks):
        """Pages the last call cached: they join the model."""
        for i, block in enumerate(blocks):
            self.pages[(ns, tuple(tokens[: (i + 1) * self.P]))] = block

    # -------------------------------------------------------------- rules
    @rule(target=sequences, tokens=st.lists(st.integers(0, 2), max_size=12))
    def new_sequence(self, tokens):
        return tokens

    @rule(target=sequences, base=sequences, extra=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def extend(self, base, extra):
        return base + extra

    @rule(tokens=sequences, ns_index=st.integers(0, 1), priority=st.sampled_from([0, 0, 1, 2]),
          expires=st.one_of(st.none(), st.integers(0, 30)))
    def admit(self, tokens, ns_index, priority, expires):
        ns = self.namespaces[ns_index % len(self.namespaces)]
        expected = self._expected(tokens, ns)
        declined = self.cache.declined_blocks
        adm = self.cache.admit(tokens, namespace=ns, priority=priority, expires_at=expires)
        assert adm.hit_tokens == len(expected) * self.P
        assert adm.blocks[: len(expected)].tolist() == expected
        assert len(adm.blocks) == len(expected) + len(adm.new_blocks)
        want_new = len(tokens) // self.P - len(expected)
        short = want_new - len(adm.new_blocks) - (self.cache.declined_blocks - declined)
        assert short >= 0
        if short:  # only short when nothing else could be evicted
            assert self.cache.evictable_blocks == 0 and self.cache.num_free_blocks == 0
        self._write_new(tokens, ns, len(expected), adm.new_blocks)
        self._assert_payload(tokens, adm.blocks)
        self.admissions.append((adm, ns, tokens))
        self._adopt(tokens, ns, adm.blocks.tolist())
        self._sync()

    @precondition(lambda self: self.admissions)
    @rule(index=st.integers(0, 20))
    def release(self, index):
        adm, _, _ = self.admissions.pop(index % len(self.admissions))
        adm.release()
        adm.release()  # idempotent

    @rule(tokens=sequences, ns_index=st.integers(0, 1), lock=st.booleans())
    def match(self, tokens, ns_index, lock):
        ns = self.namespaces[ns_index % len(self.namespaces)]
        expected = self._expected(tokens, ns)
        m = self.cache.match(tokens, namespace=ns)
        assert m.num_tokens == len(expected) * self.P
        assert m.blocks.tolist() == expected
        self._assert_payload(tokens, m.blocks)
        if lock:
            self.cache.lock(m.node)
            self.locks.append((m.node, ns, tokens[: m.num_tokens]))

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 20))
    def unlock(self, index):
        handle, _, _ = self.locks.pop(index % len(self.locks))
        self.cache.unlock(handle)

    @rule(n=st.integers(0, 6))
    def allocate(self, n):
        possible = self.cache.num_free_blocks + self.cache.evictable_blocks
        blocks = self.cache.allocate(n)
        if n > possible:
            assert blocks is None
            return
        assert blocks is not None and len(blocks) == n
        self._sync()
        assert not set(blocks.tolist()) & set(self.pages.values()), "allocated a cached block"
        assert not set(blocks.tolist()) & set(self.held), "allocated a held block twice"
        self.held.extend(blocks.tolist())

    @rule(tokens=sequences, ns_index=st.integers(0, 1))
    def insert(self, tokens, ns_index):
        ns = self.namespaces[ns_index % len(self.namespaces)]
        num_pages = len(tokens) // self.P
        m = self.cache.match(tokens, namespace=ns)
        matched = m.num_tokens // self.P
        need = num_pages - matched
        if len(self.held) < need:
            return
        new = self.held[:need]
        blocks = m.blocks.tolist() + new
        self._write_new(tokens, ns, matched, new)
        declined = self.cache.declined_blocks
        present = self.cache.insert(tokens, blocks, namespace=ns)
        assert present == matched
        self.held = self.held[need:]
        kept = need - (self.cache.declined_blocks - declined)
        self._adopt(tokens, ns, blocks[: matched + kept])
        self._sync()
        self._assert_payload(tokens, self.cache.match(tokens, namespace=ns).blocks)

    @rule(tokens=sequences)
    def insert_duplicate_blocks(self, tokens):
        """Insert of already-cached pages with fresh held blocks: the duplicates go back to the pool."""
        m = self.cache.match(tokens)
        matched = m.num_tokens // self.P
        if matched == 0 or len(self.held) < matched:
            return
        dup = self.held[:matched]
        free_before = self.cache.num_free_blocks
        present = self.cache.insert(tokens[: matched * self.P], dup)
        assert present == matched
        assert self.cache.num_free_blocks == free_before + matched
        self.held = self.held[matched:]

    @precondition(lambda self: self.held)
    @rule(count=st.integers(1, 4))
    def free(self, count):
        blocks, self.held = self.held[:count], self.held[count:]
        self.cache.free(blocks)

    @rule(n=st.integers(0, 8))
    def evict(self, n):
        evictable = self.cache.evictable_blocks
        freed = self.cache.evict(n)
        assert freed == min(n, evictable)

    @rule(tokens=sequences)
    def stale_handle(self, tokens):
        """A handle whose pages were evicted raises instead of pointing elsewhere."""
        m = self.cache.match(tokens)
        if m.num_tokens == 0:
            return
        self.cache.evict(self.cache.num_blocks)
        if m.node._node.gen != m.node._gen:
            try:
                self.cache.lock(m.node)
            except StaleHandleError:
                pass
            else:
                raise AssertionError("lock of a stale handle succeeded")

    @rule(tokens=sequences)
    def pin(self, tokens):
        expected = self._expected(tokens, None)
        pinned = self.cache.pin(tokens)
        assert pinned == len(expected) * self.P
        if pinned:
            self.pins.append(tuple(tokens[:pinned]))

    @rule(tokens=sequences)
    def unpin(self, tokens):
        full = tuple(tokens[: len(tokens) // self.P * self.P])
        covering = [p for p in self.pins if full[: len(p)] == p]
        if not covering:
            before = snapshot(self.cache)
            with pytest.raises(LockError):
                self.cache.unpin(tokens)
            assert snapshot(self.cache) == before
            return
        deepest = max(covering, key=len)
        assert self.cache.unpin(tokens) == len(deepest)
        self.pins.remove(deepest)

    # -------------------------------------------------------------- invariants
    @invariant()
    def consistent(self):
        if not hasattr(self, "cache"):
            return
        self.cache.check()
        self._sync()
        # protected pages are never evicted
        for adm, ns, tokens in self.admissions:
            for i, block in enumerate(adm.blocks.tolist()):
                assert self.pages.get((ns, tuple(tokens[: (i + 1) * self.P]))) == block, "admitted page lost"
        for handle, ns, tokens in self.locks:
            assert handle._node.gen == handle._gen, "a locked node changed extent"
            assert len(longest_cached(self.pages, tokens, self.P, ns)) == len(tokens) // self.P
        for prefix in self.pins:
            assert len(self._expected(prefix, None)) == len(prefix) // self.P, "pinned page lost"
        assert self.cache.num_held_blocks == len(self.held)
        assert self.cache.evicted_blocks >= self.evicted_before
        self.evicted_before = self.cache.evicted_blocks

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for adm, _, _ in self.admissions:
            adm.release()
        for handle, _, _ in self.locks:
            self.cache.unlock(handle)
        for prefix in self.pins:
            self.cache.unpin(list(prefix))
        self.cache.check()
        assert self.cache.protected_blocks == 0
        evictable = self.cache.evictable_blocks
        assert self.cache.evict(self.cache.num_blocks) == evictable
        assert self.cache.num_cached_blocks == 0
        self.cache.free(self.held)
        self.cache.check()
        assert self.cache.num_free_blocks == self.cache.num_blocks


def _machine_for(policy: str):
    machine = type(f"CacheMachine_{policy}", (CacheMachine,), {"policy_name": policy})
    # LRU is the default and gets the deepest search; every other policy a lighter one.
    examples, steps = (300, 50) if policy == "lru" else (100, 40)
    if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
        examples *= 10
    machine.TestCase.settings = settings(max_examples=examples, stateful_step_count=steps, deadline=None)
    return machine.TestCase


for _policy in available():
    globals()[f"TestCacheMachine_{_policy}"] = _machine_for(_policy)
