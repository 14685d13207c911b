"""The descent through a leaf that lost tail pages: its stale token bytes never count."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache

PROMPT = list(range(1, 9))  # 4 pages of 2 tokens


def tail_evicted() -> tuple:
    """A cache holding PROMPT as one leaf of 4 pages, then 2 tail pages evicted."""
    cache = PrefixCache(num_blocks=8, page_size=2)
    adm = cache.admit(PROMPT)
    blocks = adm.blocks.tolist()
    adm.release()
    assert cache.evict(2) == 2
    return cache, blocks


@pytest.mark.parametrize("tokens", [PROMPT, PROMPT[:4] + [90, 91, 92, 93], PROMPT[:4]],
                         ids=["evicted-pages-again", "other-pages", "exactly-what-is-left"])
def test_match_counts_only_the_pages_left(tokens):
    cache, blocks = tail_evicted()
    m = cache.match(tokens)
    assert m.num_tokens == 4 and m.blocks.tolist() == blocks[:2]
    assert m.node.num_pages == 2
    cache.check()


def test_extending_a_tail_evicted_leaf_caches_the_pages_again():
    cache, blocks = tail_evicted()
    adm = cache.admit(PROMPT)
    assert adm.hit_tokens == 4 and adm.blocks[:2].tolist() == blocks[:2] and len(adm.new_blocks) == 2
    adm.release()
    cache.check()
    node = adm.node._node.parent  # the old leaf, now with a child
    assert node.num_pages == 2 and len(node.rest) == 2 * 4  # its stale bytes went when it got a child
    m = cache.match(PROMPT)
    assert m.num_tokens == 8 and m.blocks.tolist() == adm.blocks.tolist()


def test_a_mismatch_inside_the_pages_left_splits_there():
    cache, blocks = tail_evicted()
    m = cache.match([1, 2, 99, 99, 5, 6])
    assert m.num_tokens == 2 and m.blocks.tolist() == blocks[:1]
    cache.check()
    assert cache.match(PROMPT).num_tokens == 4


def test_match_blocks_are_a_new_writable_int32_array():
    cache = PrefixCache(num_blocks=16, page_size=2)
    for tokens in (PROMPT, PROMPT[:4] + [50, 51], PROMPT[:2] + [60, 61]):
        cache.admit(tokens).release()
    m = cache.match(PROMPT)  # crosses three nodes
    assert m.blocks.dtype == np.int32 and m.blocks.flags.writeable and m.blocks.flags.c_contiguous
    before = m.blocks.tolist()
    m.blocks[:] = -1
    assert cache.match(PROMPT).blocks.tolist() == before
    cache.check()
