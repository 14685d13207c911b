"""Lower tiers below HBM: host DRAM, remote hosts (simulated or Redis), and the tiered engine.

>>> from radixkv.tiers import TieredCache, HostTier, RemoteTier
>>> cache = TieredCache(1024, tiers=[HostTier(4096), RemoteTier(blocks_per_host=8192, num_hosts=2)])

Layering: the tree knows nothing of tiers; :class:`TierStack` keeps lower
residency in a spill tree of its own; :class:`TieredCache` puts it behind the
engine's lower-tier seam (:mod:`radixkv.lower`) as a ``TierLayer``.
"""

from .base import Copy, RemoteHostError, Tier, TierConfigError, checksums
from .tiered import LOAD_BACK, TIER_PATHS, WRITE_POLICIES, TieredCache, TierStats, default_cost_model
from .host import HostTier
from .remote import HostDown, RemoteBackend, RemoteTier, SimulatedHosts
from .redis_backend import RedisBackend
from .stack import TierStack
from .transfers import TransferLedger, TransferTotals

__all__ = [
    "Copy", "HostDown", "HostTier", "LOAD_BACK", "RedisBackend", "RemoteBackend", "RemoteHostError", "RemoteTier",
    "SimulatedHosts", "TIER_PATHS", "Tier", "TierConfigError", "TierStack", "TieredCache", "TierStats",
    "TransferLedger", "TransferTotals", "WRITE_POLICIES", "checksums", "default_cost_model",
]
