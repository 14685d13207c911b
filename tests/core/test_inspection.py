"""The read-only inspection surface of PrefixCache: it answers what a match would, and asking
changes nothing (no use counted, no clock, no split), so an observer cannot change what is
evicted next."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.errors import StaleHandleError
from radixkv.policies import available

from ..strategies import snapshot

_ops = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.lists(st.integers(0, 2), max_size=12)),
                min_size=1, max_size=25)


@settings(deadline=None)
@given(ops=_ops, probes=_ops, policy=st.sampled_from([p for p in available() if p != "belady"]))
def test_peeks_agree_with_match_and_change_nothing(ops, probes, policy):
    twins = [PrefixCache(num_blocks=6, page_size=2, policy=policy) for _ in range(2)]
    for namespace, tokens in ops:
        for i, cache in enumerate(twins):
            before = snapshot(cache)
            if i == 0:  # the twin that is asked, between every step, what it holds
                for ns, probe in probes:
                    n = cache.cached_pages(probe, namespace=ns)
                    m = cache.peek_match(probe, namespace=ns)
                    assert m.num_tokens <= n * 2 and len(m.blocks) == m.num_tokens // 2
                    assert list(cache.path_blocks(m.node)) == list(m.blocks)
                    assert set(cache.namespaces()) == {ns for ns, _ in cache.namespace_roots()}
                    assert cache.holds_namespace(ns) == (ns in cache.namespaces())
                    assert sum(node.num_pages for node in cache.nodes()) == cache.num_cached_blocks
                assert snapshot(cache) == before
                cache.check()
            cache.admit(tokens, namespace=namespace).release()
        assert snapshot(twins[0]) == snapshot(twins[1])
    for ns, probe in probes:  # and what the peeks said is what a match finds
        n = twins[0].cached_pages(probe, namespace=ns)
        assert twins[0].match(probe, namespace=ns).num_tokens == n * 2


def test_path_blocks_refuses_a_stale_handle():
    cache = PrefixCache(num_blocks=2, page_size=2)
    cache.admit([1, 2, 3, 4]).release()
    handle = cache.peek_match([1, 2, 3, 4]).node
    assert list(cache.path_blocks(handle)) == list(cache.match([1, 2, 3, 4]).blocks)
    cache.admit([5, 6, 7, 8]).release()  # evicts both pages
    with pytest.raises(StaleHandleError):
        cache.path_blocks(handle)
