"""Build a cache from flat options (the CLI's and the benchmarks'): tiers by count and capacity."""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Optional, Sequence, Union

import numpy as np

from ..cache import PrefixCache
from ..errors import ArgumentTypeError, ArgumentValueError
from ..keys import check_positive_int
from .base import Tier, TierConfigError
from .tiered import WRITE_POLICIES, TieredCache
from .host import HostTier
from .remote import RemoteTier


_FRESH = itertools.count()


def open_store(url: str, page_size: int, *, kv_shape: Optional[Sequence[int]] = None, dtype: Any = "float16",
               model: str = "radixkv", store_blocks: Optional[int] = None, timeout: float = 0.25) -> Any:
    """A :class:`radixkv.store.PageStore` at ``url`` for caches of ``page_size`` (and ``kv_shape`` /
    ``dtype`` payloads; without one, the pages carry no payload and the fingerprint says so).

    ``url`` is ``memory`` (a new in-process store of its own), ``memory://NAME`` (shared by name
    in this process), ``redis://HOST:PORT[/DB]`` (a server or a cluster, shared by every
    process that opens it), ``mooncake://HOST:PORT[?metadata=...]`` (a Mooncake Store master),
    or ``mooncake`` (a Mooncake master and storage node of its own on free loopback ports,
    stopped when the store is closed or garbage collected; about 1.2 s to start). ``store_blocks``
    bounds an in-process store or a single Redis server (its ``?capacity=``: least recently used
    pages go first, exactly), or sizes the segment of ``mooncake``'s storage node to hold about
    that many pages; a running Mooncake store is bounded by its storage nodes' segments. ``timeout``: seconds
    a server may take to answer a call before its pages count as misses. Raises
    ArgumentValueError for a URL it cannot use or a bound it cannot apply, ArgumentTypeError for a URL
    that is not a str.
    """
    from ..store import Fingerprint, PageStore, drop_memory
    from ..store.backends import bounded

    if not isinstance(url, str):  # before store_blocks reads it as one
        raise ArgumentTypeError(f"store URL must be a str, got {url!r}")
    fresh = url == "memory"
    if fresh:
        url = f"memory://radixkv-{next(_FRESH)}-{id(_FRESH):x}"
    if store_blocks is not None:
        check_positive_int(store_blocks, "store_blocks")
    if store_blocks is not None and url != "mooncake":
        if not url.startswith(("memory://", "redis://", "rediss://", "unix://")):
            raise ArgumentValueError("store_blocks bounds an in-process store, a Redis server (its ?capacity=) or "
                                     "the Mooncake master of 'mooncake'; a running Mooncake store is bounded by "
                                     "its storage nodes' segments")
        url = bounded(url, store_blocks)
    fingerprint = Fingerprint(model=model, dtype=np.dtype(dtype).name, kv_shape=tuple(kv_shape or (1,)),
                              page_size=page_size, extra="" if kv_shape else "no payload")
    if url == "mooncake":
        from ..store.mooncake_backend import embedded_backend, sizing

        segment, watermark = sizing(store_blocks, page_size, kv_shape, dtype)
        return PageStore(embedded_backend(segment, timeout=timeout, watermark=watermark), fingerprint)
    store = PageStore.open(url, fingerprint=fingerprint, timeout=timeout)
    if fresh:  # its own: its pages go with it
        weakref.finalize(store, drop_memory, url[len("memory://"):].split("?")[0])
    return store


def build_cache(num_blocks: int, page_size: int = 16, policy: str = "lru", *, host_blocks: int = 0,
                write_policy: str = "write_back", remote_hosts: int = 0, remote_blocks: int = 0,
                redis_urls: Sequence[str] = (), load_back: str = "cost",
                kv_shape: Optional[Sequence[int]] = None,
                enable_events: bool = False, store: Optional[Any] = None) -> Union[PrefixCache, TieredCache]:
    """A plain :class:`PrefixCache` when no tier (and no store) is asked for, else a :class:`TieredCache`.

    ``host_blocks`` > 0 adds a host tier; ``remote_hosts`` x ``remote_blocks`` adds a
    remote tier (in-process), or one Redis server per URL in ``redis_urls`` with
    ``remote_blocks`` slots each; ``store`` (:func:`open_store`) shares pages with every
    cache that opens the same store. Raises :class:`TierConfigError` / ``TypeError`` on bad values.
    """
    host_blocks = check_positive_int(host_blocks, "host_blocks", allow_zero=True)
    remote_hosts = check_positive_int(remote_hosts, "remote_hosts", allow_zero=True)
    remote_blocks = check_positive_int(remote_blocks, "remote_blocks", allow_zero=True)
    if write_policy not in WRITE_POLICIES:
        raise TierConfigError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}, got {write_policy!r}")
    urls = list(redis_urls or ())
    if urls and remote_hosts and remote_hosts != len(urls):
        raise TierConfigError(f"remote_hosts={remote_hosts!r} but {len(urls)} Redis URLs were given")
    if (remote_hosts or urls) and not remote_blocks:
        raise TierConfigError("remote_blocks must be > 0 when remote hosts are configured, got 0")
    if remote_blocks and not (remote_hosts or urls):
        raise TierConfigError(f"remote_blocks={remote_blocks!r} needs remote_hosts or Redis URLs")
    tiers: list[Tier] = []
    if host_blocks:
        tiers.append(HostTier(host_blocks, policy))
    if urls:
        from .redis_backend import RedisBackend
        tiers.append(RemoteTier(remote_blocks, backend=RedisBackend(urls), policy=policy))
    elif remote_hosts:
        tiers.append(RemoteTier(remote_blocks, num_hosts=remote_hosts, policy=policy))
    if not tiers and write_policy == "write_back" and store is None:
        return PrefixCache(num_blocks, page_size, policy, kv_shape, enable_events=enable_events)
    return TieredCache(num_blocks, page_size, policy, kv_shape, tiers=tiers, write_policy=write_policy,
                       load_back=load_back, enable_events=enable_events, store=store)
