"""Shared hypothesis strategies and helpers for radixkv's tests."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.keys import TOKEN_DTYPE

# A tiny alphabet makes token sequences collide on prefixes often.
small_tokens = st.lists(st.integers(0, 2), min_size=0, max_size=14)

PageKey = Tuple[Optional[str], Tuple[int, ...]]


def cached_pages(cache: PrefixCache, with_locks: bool = False) -> Dict[PageKey, int]:
    """Every cached page as ``(namespace, token prefix through that page) -> block``, read from the tree.

    With ``with_locks`` the value is ``(block, lock_ref of its node)``: independent of how
    the pages happen to be split into nodes.
    """
    out: Dict[PageKey, int] = {}
    pb = cache._tree.page_bytes
    for namespace, root in cache._tree.roots():
        stack = [(root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in (node.children or {}).values():
                tokens = np.frombuffer(child.key[: child.num_pages * pb], dtype=TOKEN_DTYPE).tolist()
                p = prefix
                for i in range(child.num_pages):
                    p = p + tuple(tokens[i * cache.page_size : (i + 1) * cache.page_size])
                    out[(namespace, p)] = (int(child.blocks[i]), child.lock_ref) if with_locks else int(child.blocks[i])
                stack.append((child, p))
    return out


def longest_cached(pages: Dict[PageKey, int], tokens, page_size: int, namespace=None) -> list:
    """Blocks of the longest cached page prefix of ``tokens`` according to the model ``pages``."""
    blocks = []
    tokens = tuple(int(t) for t in tokens)
    for end in range(page_size, len(tokens) + 1, page_size):
        block = pages.get((namespace, tokens[:end]))
        if block is None:
            break
        blocks.append(block)
    return blocks


def snapshot(cache: PrefixCache):
    """Everything observable about a cache, to assert that a failed call changed nothing."""
    return (
        cached_pages(cache, with_locks=True), cache.num_free_blocks, cache.num_cached_blocks,
        cache.protected_blocks, cache.evictable_blocks, cache.num_held_blocks, cache.evicted_blocks,
    )


def payload_for(page_key: Tuple[int, ...], shape) -> np.ndarray:
    """Deterministic payload of one page, derived from its token prefix."""
    rng = np.random.default_rng(abs(hash(page_key)) % (2**32))
    return rng.standard_normal(shape).astype(np.float32)
