"""What every lower tier provides: slots, payload storage, a victim order.

A tier stores pages below HBM. It hands out *slots* (int64 ids, one per
page), stores and returns page payloads by slot, and ranks the spill-tree
nodes it holds with its own eviction policy (any registered online one; an
offline policy such as ``belady`` is refused, see :class:`Tier`) in its own
victim queue, through HBM's victim loop (``on_victim``, then
``on_evict``). It never decides where pages go next: the
:class:`~radixkv.tiers.stack.TierStack` reserves slots, evicts (demoting to
the next tier or dropping) and records transfers. Payload integrity is the
stack's job too: it computes a checksum when a page leaves HBM and verifies
it whenever the page comes back.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .. import policies as _policies
from ..errors import RadixKVError
from ..keys import check_positive_int
from ..tree import Node
from ..victims import VictimQueue, make_queue

SLOT_DTYPE = np.dtype(np.int64)
NO_SLOTS = np.empty(0, dtype=SLOT_DTYPE)


class TierConfigError(RadixKVError, ValueError):
    """A tier or write policy is configured with a bad value (negative capacity, unknown name)."""


class RemoteHostError(RadixKVError, ConnectionError):
    """A remote host could not be reached (raised at start-up; during a replay it becomes a miss)."""


_QUEUE_IDS = itertools.count(1)


class TierQueue(VictimQueue):
    """A victim queue whose entry ids never collide with another queue's.

    A node moves between tiers' queues keeping one ``heap_id`` slot; disjoint
    id ranges make a stale entry left in the old queue unable to match it.
    """

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self._next_id = next(_QUEUE_IDS) << 40


class Copy:
    """The residency of one spill-tree node: its pages live in ``tier`` at ``slots``.

    Attributes:
        tier: the tier holding every page of the node (residency is uniform per node).
        slots: one slot id per page.
        sums: CRC-32 of each page's payload bytes, or ``None`` when the cache keeps no payload.
        stamp: the tier-clock value the node entered its tier with (kept when it cascades).
        blockers: children that keep the node in its tier (the stack maintains it): a
            child blocks unless it is a copy in a *later* tier. Only unblocked nodes are
            victims, as only leaves are in HBM, so leaving a tier never strands a copy.
    """

    __slots__ = ("tier", "slots", "sums", "stamp", "blockers")

    def __init__(self, tier: "Tier", slots: np.ndarray, sums: Optional[np.ndarray], stamp: int) -> None:
        self.tier = tier
        self.slots = slots
        self.sums = sums
        self.stamp = stamp
        self.blockers = 0

    def split(self, pages: int) -> Tuple["Copy", "Copy"]:
        """The copies of the first ``pages`` pages and of the rest."""
        sums = self.sums
        return (Copy(self.tier, self.slots[:pages].copy(), None if sums is None else sums[:pages].copy(), self.stamp),
                Copy(self.tier, self.slots[pages:].copy(), None if sums is None else sums[pages:].copy(), self.stamp))


class InFlight:
    """Marker residency of a node whose pages are being placed (keeps it out of garbage collection)."""

    __slots__ = ()


IN_FLIGHT = InFlight()


def checksums(pages: np.ndarray) -> np.ndarray:
    """CRC-32 of each page's bytes (``pages`` has one page per row). O(bytes), C speed per page."""
    flat = np.ascontiguousarray(pages).reshape(len(pages), -1).view(np.uint8)
    return np.fromiter((zlib.crc32(row) for row in flat), dtype=np.uint32, count=len(pages))


def check_capacity(value: object, name: str) -> int:
    """``value`` as a positive int, or :class:`TierConfigError` / ``TypeError`` naming it."""
    return check_positive_int(value, name, value_error=TierConfigError)


class PolicyScope:
    """What a lower tier's eviction policy may ask of "its cache" in ``attach``.

    Attributes:
        page_size: tokens per page.
        num_blocks: the tier's capacity in pages when it joined the cache.
        cost_model: the cache's :class:`~radixkv.costs.CostModel` (gdsf ranks by it).
    """

    __slots__ = ("page_size", "num_blocks", "cost_model")

    def __init__(self, page_size: int, num_blocks: int, cost_model: Any) -> None:
        self.page_size = page_size
        self.num_blocks = num_blocks
        self.cost_model = cost_model


class Tier:
    """Base class of a lower tier: subclasses manage slots and payload bytes.

    Args:
        name: tier name; it must name a path in the cost model (``"host"``, ``"remote"``, ...).
        policy: eviction policy name or instance ranking this tier's nodes. Offline
            policies (``belady``) raise :class:`TierConfigError`: their future is indexed
            by the engine's request clock, while a tier sees pages only after HBM let them
            go, on a clock of its own, and never consults ``admit`` (bypass). Use belady
            for HBM over online tiers.
    """

    def __init__(self, name: str, policy: Union[str, "_policies.EvictionPolicy"] = "lru") -> None:
        if not isinstance(name, str) or not name or name == "hbm":
            raise TierConfigError(f"tier name must be a non-empty string other than 'hbm', got {name!r}")
        self.name = name
        self.policy = _policies.create(policy)
        if self.policy.offline:
            raise TierConfigError(f"a lower tier needs an online policy; {self.policy.name!r} is offline "
                                  f"(it ranks by the future of HBM's requests), got policy={policy!r}")
        self.victims: VictimQueue = make_queue(self.policy, TierQueue)
        self.used = 0
        """Slots holding a page. O(1)."""
        self.page_shape: Optional[Tuple[int, ...]] = None
        self.dtype: Optional[np.dtype] = None
        self.stack: Optional[Any] = None
        """The :class:`~radixkv.tiers.stack.TierStack` this tier joined (one cache's), or ``None``."""

    # -- set by the stack when the tier joins a cache
    def attach(self, page_size: int, kv_shape: Optional[Sequence[int]], dtype: Any) -> None:
        """Learn the page payload shape (``None`` for no payload). Called once by the cache."""
        self.page_shape = None if kv_shape is None else (page_size, *tuple(kv_shape))
        self.dtype = np.dtype(dtype)

    def attach_policy(self, page_size: int, cost_model: Any) -> None:
        """Attach this tier's policy as :class:`~radixkv.cache.PrefixCache` attaches its own.

        The policy sees a :class:`PolicyScope` (this tier's capacity, the
        cache's page size and cost model) instead of a cache, so policies
        sized by capacity (s3fifo, adaptive) or ranked by restore cost (gdsf)
        work in a lower tier too. Called once by the cache; may raise the
        policy's own ``ValueError`` (a cost model of another page size).
        """
        self.policy.claim()  # one tier per policy, as one cache per policy
        try:
            self.policy.attach(PolicyScope(page_size, self.capacity, cost_model))
        except BaseException:
            self.policy.unclaim()
            raise

    @property
    def capacity(self) -> int:
        """Slots this tier can hold now."""
        raise NotImplementedError

    @property
    def num_free(self) -> int:
        """Slots that :meth:`take` can hand out without eviction."""
        return self.capacity - self.used

    def take(self, n: int) -> np.ndarray:
        """Up to ``n`` free slots (fewer when short; never evicts)."""
        raise NotImplementedError

    def give(self, slots: np.ndarray) -> None:
        """Free ``slots`` (their payloads are forgotten)."""
        raise NotImplementedError

    def write(self, slots: np.ndarray, pages: Optional[np.ndarray]) -> np.ndarray:
        """Store one page per slot (``pages`` is ``None`` without payload); return a per-slot ok mask."""
        raise NotImplementedError

    def read(self, slots: np.ndarray) -> Tuple[Optional[np.ndarray], np.ndarray]:
        """Payloads of ``slots`` (``None`` without payload) and a per-slot mask of those found."""
        raise NotImplementedError

    def lost_slots(self, slots: np.ndarray) -> np.ndarray:
        """Mask of ``slots`` whose storage is known to be gone (a dead remote host)."""
        return np.zeros(len(slots), dtype=bool)

    def take_lost(self) -> bool:
        """True once after storage was lost since the last call (the stack then sweeps)."""
        return False

    # -- residency hooks (the borrowed tier tracks which node holds each slot)
    def on_assign(self, node: Node) -> None:
        """``node.ext`` became a :class:`Copy` in this tier."""

    def on_release(self, node: Node) -> None:
        """``node`` is about to lose its copy in this tier."""

    def check(self) -> None:
        """Tier-local invariants (slot accounting); the stack checks residency."""

    def close(self) -> None:
        """Release external resources (connections)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, used={self.used}, capacity={self.capacity})"
