"""A vLLM-shaped view of a :class:`~radixkv.PrefixCache`: cached pages by block hash.

vLLM v1 finds cached blocks by chained block hash
(``BlockPool.get_cached_block``, ``find_longest_cache_hit``); routers and KV
connectors that speak those hashes can ask radixkv the same questions here.
The hashes are :mod:`radixkv.events.hashing`'s: with the cache's default
:class:`~radixkv.events.hashing.BlockHasher` they equal the block hashes of a vLLM
0.33.0 started with default settings (``sha256``, ``PYTHONHASHSEED`` unset)
for the same block size and ``cache_salt`` (radixkv's namespace, hashed as
vLLM's tagged ``("cache_salt", salt)`` key). A vLLM using another
``--prefix-caching-hash-algo`` or ``PYTHONHASHSEED`` needs the matching
``cache.attach_page_hashes(BlockHasher(hash_fn, hash_seed))`` (or
``PrefixCache(enable_events=BlockHasher(hash_fn, hash_seed))``).

>>> from radixkv import PrefixCache
>>> cache = PrefixCache(num_blocks=8, page_size=2)
>>> _ = cache.attach_page_hashes()   # or PrefixCache(..., enable_events=True)
>>> cache.admit([5, 6, 7, 8], namespace="tenant-a").release()
>>> view = VLLMBlockView(cache)
>>> hashes = view.block_hashes([5, 6, 7, 8], cache_salt="tenant-a")
>>> view.find_longest_cache_hit(hashes)
[0, 1]
>>> view.find_longest_cache_hit(view.block_hashes([5, 6, 7, 8]))   # no salt: another namespace
[]
"""

from __future__ import annotations

from typing import Hashable, List, Optional, Sequence, Union

import numpy as np

from ...cache import PrefixCache
from ...errors import ArgumentTypeError, ArgumentValueError
from ...events.hashing import BlockHash


class VLLMBlockView:
    """Read-only lookup of ``cache``'s pages by vLLM-compatible block hash.

    Reads the cache's page-hash index (:attr:`PrefixCache.page_hashes`): the
    cache must keep one, after :meth:`PrefixCache.attach_page_hashes` or when
    created with ``enable_events``. Lookups do not count as uses (no LRU touch)
    and do not protect anything: to use the blocks, ``match`` and ``lock``
    through the cache.

    Tenant-blind: it answers for every tenant's pages, whatever the cache's
    sharing rule, so it must not face a tenant (a router or an operator may
    use it; a request's lookup goes through ``match`` with its ``tenant``).
    """

    __slots__ = ("_cache", "_index")

    def __init__(self, cache: PrefixCache) -> None:
        if not isinstance(cache, PrefixCache):
            raise ArgumentTypeError(f"cache must be a PrefixCache, got {cache!r}")
        if cache.page_hashes is None:
            raise ArgumentValueError(
                "VLLMBlockView needs the cache's page-hash index: call cache.attach_page_hashes() "
                "(or create the cache with enable_events=True)")
        self._cache = cache
        self._index = cache.page_hashes

    @property
    def block_size(self) -> int:
        """Tokens per block (the cache's ``page_size``)."""
        return self._cache.page_size

    def block_hashes(self, tokens: Union[Sequence[int], np.ndarray], *,
                     cache_salt: Optional[Hashable] = None) -> List[BlockHash]:
        """vLLM's block hashes of every full block of ``tokens`` (``cache_salt`` = namespace). O(len).

        As vLLM's request block hasher for a request without LoRA or multimodal
        inputs; ``cache_salt=""`` is radixkv's namespace ``""`` (vLLM would
        treat an empty salt as none).
        """
        return self._index.hasher.hash_pages(tokens, self._cache.page_size, namespace=cache_salt)

    def get_cached_block(self, block_hash: BlockHash) -> Optional[int]:
        """The block caching the page with this hash, or ``None``. O(1)."""
        if not isinstance(block_hash, (bytes, bytearray)):
            raise ArgumentTypeError(f"block_hash must be the full hash bytes, got {block_hash!r}")
        return self._index.lookup(bytes(block_hash))

    def __contains__(self, block_hash: object) -> bool:
        return isinstance(block_hash, (bytes, bytearray)) and self._index.lookup(bytes(block_hash)) is not None

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash]) -> List[int]:
        """Blocks of the longest run of ``block_hashes``, from the first, that is cached.

        Chained hashes make a hit on hash ``i`` imply the whole prefix up to
        ``i`` matched, so the first miss ends the hit. O(hit length).
        """
        out: List[int] = []
        for h in block_hashes:
            block = self.get_cached_block(h)
            if block is None:
                break
            out.append(block)
        return out

    def __repr__(self) -> str:
        return f"VLLMBlockView(block_size={self.block_size}, cached={self._cache.num_cached_blocks})"
