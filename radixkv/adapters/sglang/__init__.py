"""A drop-in for SGLang's ``RadixCache``, backed by :class:`~radixkv.PrefixCache`.

Target: **SGLang 0.5.23** (``python/sglang/srt/mem_cache/base_prefix_cache.py``,
``radix_cache.py``, and the scheduler's calls in ``mem_cache/common.py``,
``mem_cache/allocation.py`` and ``managers/schedule_policy.py``).
:class:`RadixKVCache` implements every abstract method of that release's
``BasePrefixCache`` with the same parameter names, kinds and defaults, plus the
methods ``RadixCache`` overrides:

* ``match_prefix(params: MatchPrefixParams) -> MatchResult(device_prefix_len,
  last_device_node, last_host_node, best_match_node, ...)``
* ``checkpoint(req, *, up_to)``: insert the request's KV up to row position
  ``up_to``, repoint its row at the tree's copies, move ``req.lock`` /
  ``req.last_node``, advance ``req.kv.cache_protected_len``. Frees only
  duplicates; SGLang's ``release_kv_cache`` frees the rest.
* ``evict(params: EvictParams) -> EvictResult``
* ``inc_lock_ref(node) -> IncLockRefResult``, ``dec_lock_ref(node, params=None)
  -> DecLockRefResult`` (``delta`` = change in evictable tokens)
* ``insert(params: InsertParams) -> InsertResult``, ``path_device_indices(node)``,
  ``touch_prefix(key)``, ``evictable_size()``, ``protected_size()``,
  ``total_size()``, ``reset()``, ``take_events()``, ``supports_prefix_sharing()``

When ``sglang`` is importable, :class:`RadixKVCache` *subclasses* SGLang's
``BasePrefixCache`` and every type here (``MatchResult``, ``EvictResult``,
``IncLockRefResult``, ``MatchPrefixParams``, ``RadixKey``, ...) **is** SGLang's
own, so the scheduler's other calls (``lock``/``unlock``, ``free_kv_row``,
``prefix_device_indices``, ``evict_for_alloc``, the SWA/mamba/storage hooks)
run SGLang's base implementations, and ``take_events()`` returns SGLang's
``kv_events`` structs (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``;
hashes as int64, ``cache_salt`` filled in), which its scheduler wraps in a
``KVEventBatch`` and publishes. Without SGLang, the types are radixkv's
mirrors (same field names and order; events from :mod:`radixkv.events`) and
:class:`StandaloneBase` provides the subset of those base methods a plain
(non-SWA, non-mamba, no host tier) cache needs. :data:`SGLANG_BASE` says which
one is in use.

Layout: :mod:`.mirrors` (SGLang's types or radixkv's mirrors, and
:class:`StandaloneBase`), :mod:`.compat` (SGLang 0.5.5's calling
conventions), :mod:`.radix_cache` (the cache face, :class:`RadixKVCache`),
:mod:`.namespaces` (``extra_key``/``cache_salt`` as a namespace),
:mod:`.eviction` (SGLang's policy names) and :mod:`.kv_events` (SGLang's
event structs).

SGLang 0.5.5's calling conventions (``match_prefix(RadixKey)``,
``insert(RadixKey, value)``) still work; :mod:`.compat` says what changed since.

Not supported: EAGLE bigram keys (``RadixKey.is_bigram``), SWA and mamba
components, HiCache host tiers, the ``dfs-weight`` schedule policy's
``dfs_weight_order`` (it walks SGLang tree nodes; radixkv hands out handles),
and the eviction policies ``mru``, ``filo``, ``priority`` and ``tlru`` (refused
with an error; :data:`SGLANG_EVICTION_POLICIES` maps the others).

Mapping. SGLang addresses KV by token slot; its paged allocator hands out
page-aligned runs, slot ``= page * page_size + offset``. radixkv's block id is
SGLang's page index (the slot itself when ``page_size == 1``), and a
:class:`~radixkv.cache.NodeHandle` is SGLang's "node". Every block radixkv
does not cache is *held* by SGLang (its allocator or a request): the adapter
takes the whole pool at start (radixkv's insert takes only blocks its caller
holds), and radixkv's free-block sink (``PrefixCache.on_free``) hands every
block radixkv lets go of (evicted, duplicate, declined) straight to SGLang's
allocator, so radixkv never owns a free block.
``RadixKey.extra_key`` (LoRA id) and ``cache_salt`` (tenant) together name
radixkv's ``namespace``: ``json.dumps([extra_key, cache_salt])``, or the
default namespace when both are unset, so distinct pairs never share a page,
as in SGLang. Aborted requests (SGLang's ``release_kv_cache`` without a
checkpoint) cache nothing: their own pages go back to the allocator, and no
checkpoint caches a position past the request's committed KV. Index tensors
may be torch tensors (results come back as int64 tensors on the pool's
device) or numpy arrays.
"""

from __future__ import annotations

from .compat import LegacyMatchResult
from .eviction import SGLANG_EVICTION_POLICIES
from .mirrors import (
    SGLANG_BASE, SGLANG_TARGET_VERSION, DecLockRefParams, DecLockRefResult, EvictParams, EvictResult,
    IncLockRefResult, InsertParams, InsertResult, MatchPrefixParams, MatchResult, RadixKey, StandaloneBase,
    TreeLock)
from .namespaces import namespace_of
from .radix_cache import RadixKVCache, register_with_sglang

# Private names this module held before it became a package, still importable from here.
from .eviction import _eviction_policy  # noqa: F401
from .kv_events import _SGLangEvents, _int64  # noqa: F401
from .mirrors import (  # noqa: F401
    _DecLockRefParams, _DecLockRefResult, _EvictParams, _EvictResult, _IncLockRefResult, _InsertParams,
    _InsertResult, _MatchPrefixParams, _MatchResult, _RadixKey, _SGLangBase, _sgl_events, _TreeLock)
from .namespaces import _cache_salt  # noqa: F401
from .radix_cache import _to_numpy  # noqa: F401

__all__ = [
    "DecLockRefParams", "DecLockRefResult", "EvictParams", "EvictResult", "IncLockRefResult",
    "InsertParams", "InsertResult", "LegacyMatchResult", "MatchPrefixParams", "MatchResult", "namespace_of",
    "RadixKVCache", "RadixKey", "SGLANG_BASE", "SGLANG_EVICTION_POLICIES", "SGLANG_TARGET_VERSION",
    "StandaloneBase", "TreeLock",
    "register_with_sglang",
]

