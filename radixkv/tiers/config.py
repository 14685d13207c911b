"""Build a cache from flat options (the CLI's and the benchmarks'): tiers by count and capacity."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..cache import PrefixCache
from ..keys import check_positive_int
from .base import Tier, TierConfigError
from .tiered import WRITE_POLICIES, TieredCache
from .host import HostTier
from .remote import RemoteTier


def build_cache(num_blocks: int, page_size: int = 16, policy: str = "lru", *, host_blocks: int = 0,
                write_policy: str = "write_back", remote_hosts: int = 0, remote_blocks: int = 0,
                redis_urls: Sequence[str] = (), load_back: str = "cost",
                kv_shape: Optional[Sequence[int]] = None,
                enable_events: bool = False) -> Union[PrefixCache, TieredCache]:
    """A plain :class:`PrefixCache` when no tier is asked for, else a :class:`TieredCache`.

    ``host_blocks`` > 0 adds a host tier; ``remote_hosts`` x ``remote_blocks`` adds a
    remote tier (in-process), or one Redis server per URL in ``redis_urls`` with
    ``remote_blocks`` slots each. Raises :class:`TierConfigError` / ``TypeError`` on bad values.
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
    if not tiers and write_policy == "write_back":
        return PrefixCache(num_blocks, page_size, policy, kv_shape, enable_events=enable_events)
    return TieredCache(num_blocks, page_size, policy, kv_shape, tiers=tiers, write_policy=write_policy,
                       load_back=load_back, enable_events=enable_events)
