"""A content-addressed page store that engine processes share: memory://, one Redis server, or a Redis Cluster.

>>> from radixkv.store import Fingerprint, PageStore
>>> fp = Fingerprint(model="llama-3-8b", dtype="float16", kv_shape=(2, 8, 128), page_size=16, tp_rank=0)
>>> store = PageStore.open("memory://fleet", fingerprint=fp)     # or "redis://127.0.0.1:6379"
>>> chain = store.chain(list(range(48)), namespace=None)         # one 36-byte key per full page
>>> store.put(chain, [bytes(64)] * 3)                             # first writer wins: pages newly stored
3
>>> store.lookup(chain)                                           # leading pages present (no bytes moved)
3
>>> pages, n = store.get(chain)                                   # verified payloads of the leading pages
>>> n
3

Modules, one job each: :mod:`~radixkv.store.keys` (fingerprint, namespace
and chained page keys), :mod:`~radixkv.store.codec` (the value format),
:mod:`~radixkv.store.backends` (the backend contract, the in-process
backend, URLs), :mod:`~radixkv.store.redis_backends` (Redis and Redis
Cluster), :mod:`~radixkv.store.redisio` (redis-py plumbing shared with
:mod:`radixkv.tiers.redis_backend`), :mod:`~radixkv.store.store` (PageStore:
leading-run reads, first-writer-wins writes, counters).
"""

from .backends import FAILED, Backend, Cooloff, MemoryBackend, Reply, drop_memory, memory_backend, open_backend
from .codec import HEADER_BYTES
from .keys import DEFAULT_PREFIX, HASH_BYTES, Fingerprint, KeyChain, Partition, check_partition
from .store import COUNTERS, PageStore

__all__ = [
    "Backend", "COUNTERS", "Cooloff", "DEFAULT_PREFIX", "FAILED", "Fingerprint", "HASH_BYTES", "HEADER_BYTES",
    "KeyChain", "MemoryBackend", "PageStore", "Partition", "Reply", "check_partition", "drop_memory",
    "memory_backend", "open_backend",
]
