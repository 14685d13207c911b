"""A cluster of prefix caches that lend spare HBM to each other, in the style of Infinite-LLM.

Each :class:`Instance` is a :class:`~radixkv.tiers.TieredCache` (its own HBM,
optionally a host tier). With borrowing on, an instance's evicted pages first
go to a :class:`BorrowedTier`: blocks lent by other instances, found through
the :class:`GlobalManager` (Infinite-LLM's gManager):

* instances report free blocks by heartbeat (after each request they serve);
* a debtor asks for creditor candidates, most free first, a few at a time,
  and borrows from the first that accepts; the manager records the debt;
* a creditor refuses when its free blocks would fall below its low
  watermark, when its lend cap is reached, when it is unavailable, or when it
  is itself a debtor (no borrowing chains; a creditor does not borrow either);
* with value lending (``lending="value"``, LRU) a creditor lends beyond its
  free blocks: it evicts its own pages for a debtor while they are clearly
  colder (on one cluster clock) than the page the debtor would lose, and
  recalls only loans colder than its own pages; a page lent out is no longer
  served by its creditor, and a borrowed hit is charged a network transfer;
* a creditor short of memory recalls loans before serving a request: each
  borrowed page moves to another creditor with room (the new block is
  reserved before the copy) or is demoted to the debtor's next tier (host) or
  dropped, with the borrowed pages below it, so no copy is left behind a
  missing prefix (:func:`~radixkv.tiers.tiered.stranded_copies`, asserted by :meth:`Cluster.check`);
* a creditor that crashes (:meth:`Cluster.crash`) takes the pages it held
  and the pages below them: its debtors forget them and the debt is written
  off. The ledger (debt matrix) always equals the loans held.

:class:`Cluster` routes requests (round robin, least loaded, cache-aware:
longest cached prefix with load as tie-break, among instances within a load
bound of the least loaded) and replays traces.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import policies as _policies
from .cache import Admission
from .errors import ArgumentTypeError, ArgumentValueError, LockError
from .keys import as_tokens, check_int, check_namespace, check_positive_int
from .workload.traces import Request
from .analysis.replay import pages_loaded
from .analysis.stats import ReplayStats, RequestRecord
from .costs import DEFAULT_HARDWARE, DEFAULT_MODEL, HardwareSpec, ModelSpec
from .tiers.base import SLOT_DTYPE, Tier, TierConfigError
from .tiers.host import HostTier
from .tiers.lending import BorrowedTier
from .tiers.tiered import TieredCache
from .tiers.config import open_store
from .store import COUNTERS as STORE_COUNTERS, drop_memory
from .global_index import GlobalPageIndex
from .router.inprocess import EventRouting
from .router.link import EventFaults

ROUTING = ("round_robin", "least_loaded", "cache_aware", "kv_events")
LENDING = ("free", "value")
DUPLICATES = ("move", "copy")
"""What a pull through the cluster-wide index leaves at its source: its copy demoted to the next to
go in the medium it was read from, HBM or host (``move``, where the policy ranks by last use: lru),
or as it was (``copy``)."""
VALUE_POLICIES = ("lru",)
"""Policies whose rank is a last-use time, comparable across instances on the cluster's clock."""


def routes_ahead(routing: str, num_instances: int) -> bool:
    """Whether every request's instance is known before any is served: round robin, or one instance.

    An offline policy (``belady``) needs each instance's future requests. Round
    robin deals them out by arrival order alone; least-loaded and cache-aware
    routing pick the instance from load and cached prefixes, which depend on
    the hits, which depend on the policy's own evictions: that future does not
    exist before the replay, so an offline policy is refused there.
    """
    return routing == "round_robin" or num_instances == 1


@dataclass(frozen=True)
class Pull:
    """Pages an admission got from a peer instance through the cluster-wide index.

    Attributes:
        pages: pages copied from ``source`` into the head of the admission's new blocks (0: none);
            they count as hits (``hit_tokens_by_tier["peer"]``), charged a network transfer.
        source: the instance they came from (``None`` when none).
        host_pages: how many of them (the last ones) came from ``source``'s host tier, charged its
            PCIe read too (the cost model's ``peer_host`` path); the others came from its HBM.
    """

    pages: int
    source: Optional[int]
    host_pages: int = 0


class Instance:
    """One serving instance: its cache, its borrowed tier (or ``None``), and load counters."""

    def __init__(self, index: int, cache: TieredCache, borrowed: Optional[BorrowedTier]) -> None:
        self.index = index
        self.cache = cache
        self.borrowed = borrowed
        self.available = True
        """False simulates a creditor that does not answer (it is skipped, never waited for)."""
        self.requests = 0
        self.prefill_tokens = 0
        """Prompt tokens this instance computed (not served from cache): its load."""

    def __repr__(self) -> str:
        return f"Instance({self.index}, free={self.cache.num_free_blocks}, requests={self.requests})"


def _timed(method):
    """Add the wall time of an outermost manager call to ``self.seconds`` (nested calls count once)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._depth:
            return method(self, *args, **kwargs)
        self._depth = 1
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self._depth = 0
    return wrapper


class GlobalManager:
    """The debt ledger and creditor search (Infinite-LLM's gManager).

    With ``by_value`` (lending decided by the value of memory, LRU only) a
    creditor lends more than its free blocks: it also evicts its coldest pages
    for a debtor while they are colder than the debtor's coldest page, the page
    the debtor would otherwise lose. The instances share one clock
    (:attr:`clock`, set by :class:`Cluster` before each request), so last-access
    times compare across instances. Each loan keeps the value (last-use rank) of
    the page it holds; a creditor short of memory recalls only loans colder
    than its own coldest page (:meth:`Cluster.admit`) and evicts its own pages
    for the rest.

    Args:
        instances: the cluster's instances (the list may be filled after construction).
        num_instances: how many there will be; stride: slot stride (the largest ``num_blocks``).
        lend_cap: share of an instance's blocks it may lend at once (0..1).
        low_watermark: share of its blocks a creditor keeps free; it refuses below.
        candidates: creditors asked per round.
        by_value: lend the slots of pages colder than the debtor's (see above), not free blocks only.
        lend_margin: with ``by_value``, how many times older than the debtor's page a creditor's page
            must be to give up its slot (see :meth:`_bar`).
    """

    def __init__(self, instances: List[Instance], num_instances: int, stride: int, lend_cap: float,
                 low_watermark: float, candidates: int, by_value: bool = False, lend_margin: float = 2.0) -> None:
        self.instances = instances
        self.lend_cap = lend_cap
        self.low_watermark = low_watermark
        self.candidates = candidates
        n = num_instances
        self.stride = stride
        self.reported_free = [0] * n
        self.debt = np.zeros((n, n), dtype=np.int64)
        """``debt[d, c]``: blocks debtor ``d`` holds at creditor ``c``."""
        self.loans: List[Dict[int, int]] = [{} for _ in range(n)]
        self.by_value = by_value
        self.lend_margin = lend_margin
        self.values: List[Dict[int, tuple]] = [{} for _ in range(n)]
        """``values[c][block]``: rank (retention, last use) of the debtor's page held in a lent block."""
        self.clock = 0
        """The cluster's clock (requests served), shared by the instances when ``by_value``."""
        self.seconds = 0.0
        """Wall time spent in the manager (borrow, repay, recall, lendable)."""
        self._depth = 0
        self._lending: Optional[int] = None  # a creditor evicting for a loan: it must not borrow meanwhile
        self.blocks_lent = 0
        """Blocks lent, counted at each loan (monotonic)."""
        self.refusals = 0
        self.evicted_to_lend = 0
        """Creditor pages evicted to lend their slots (``by_value``)."""
        self.recalled = 0
        self.moved = 0
        self.demoted = 0

    def heartbeat(self, index: int) -> None:
        """Instance ``index`` reports its free blocks. O(1)."""
        self.reported_free[index] = self.instances[index].cache.num_free_blocks

    def lent(self, creditor: int) -> int:
        return len(self.loans[creditor])

    def owed(self, debtor: int) -> int:
        return int(self.debt[debtor].sum())

    def coldest(self, index: int) -> Optional[tuple]:
        """Rank (retention, last use) of instance ``index``'s coldest evictable HBM page, ``None`` if none. O(1) amortized."""
        if index >= len(self.instances):  # still being built
            return None
        victim = self.instances[index].cache.peek_victim()
        return None if victim is None else victim[:2]

    def _cap(self, creditor: int) -> int:
        """Blocks ``creditor`` may still lend under the lend cap (negative once past it)."""
        return int(self.lend_cap * self.instances[creditor].cache.num_blocks) - self.lent(creditor)

    def _room(self, creditor: int) -> int:
        inst = self.instances[creditor]
        cache = inst.cache
        floor = math.ceil(self.low_watermark * cache.num_blocks)
        return max(0, min(cache.num_free_blocks - floor, self._cap(creditor)))

    @_timed
    def lendable(self, debtor: int) -> int:
        """Blocks creditors would lend ``debtor`` now (reported view). O(instances).

        ``by_value``: up to the lend cap of every creditor whose coldest page is
        colder than the debtor's (what :meth:`borrow` will try), so the borrowed
        tier asks; :meth:`borrow` gets what is really there.
        """
        if self.lent(debtor) or debtor == self._lending:
            return 0
        value = self.coldest(debtor) if self.by_value else None
        total = 0
        for c in range(len(self.instances)):
            if c == debtor or self.owed(c) or not self.instances[c].available:
                continue
            room = self._room(c)
            if value is not None and not room:
                cold = self.coldest(c)
                if cold is not None and cold < self._bar(value):
                    room = max(0, self._cap(c))
            total += room
        return total

    def creditors(self, debtor: int, exclude: Sequence[int] = ()) -> Iterator[List[int]]:
        """Candidate creditors, most reported-free first, in rounds of :attr:`candidates`."""
        order = sorted((c for c in range(len(self.instances))
                        if c != debtor and c not in exclude and not self.owed(c)),
                       key=lambda c: (-self.reported_free[c], c))
        for i in range(0, len(order), self.candidates):
            yield order[i: i + self.candidates]

    @_timed
    def borrow(self, debtor: int, n: int, exclude: Sequence[int] = (), value: Optional[tuple] = None) -> np.ndarray:
        """Up to ``n`` slots lent to ``debtor``; refusals just move on (nobody waits).

        ``value``: rank of the pages to hold (default: the debtor's coldest
        page). With ``by_value`` a creditor past its free blocks evicts its own
        pages colder than ``value`` to lend their slots. O(instances + pages
        evicted x log pages).
        """
        if n <= 0 or self.lent(debtor) or debtor == self._lending:  # a creditor does not borrow: no chains
            return np.empty(0, dtype=SLOT_DTYPE)
        if self.by_value and value is None:
            value = self.coldest(debtor)
        parts = []
        got = 0
        for group in self.creditors(debtor, exclude):
            for c in group:
                m = min(n - got, self._room(c)) if self.instances[c].available else 0
                if self.by_value and value is not None and self.instances[c].available:
                    m += self._evict_colder(c, min(n - got, self._cap(c)) - m, self._bar(value))
                if m <= 0:
                    self.refusals += 1
                    continue
                blocks = self.instances[c].cache.allocate(m)
                for b in blocks.tolist():
                    self.loans[c][b] = debtor
                    self.values[c][b] = value
                self.debt[debtor, c] += m
                self.blocks_lent += m
                self.heartbeat(c)
                parts.append(blocks.astype(SLOT_DTYPE) + c * self.stride)
                got += m
                if got >= n:
                    return np.concatenate(parts)
        return np.concatenate(parts) if parts else np.empty(0, dtype=SLOT_DTYPE)

    def _bar(self, value: tuple) -> tuple:
        """The rank a creditor's page must be below to be evicted for a debtor's page of rank ``value``.

        Its age (clock ticks since last use) must exceed :attr:`lend_margin` x the
        debtor page's: hysteresis, so instances under the same load do not trade
        pages back and forth (each trade is a network copy and, on recall, a loss).
        """
        retention, used = value
        return retention, self.clock - self.lend_margin * (self.clock - used)

    def _evict_colder(self, creditor: int, n: int, value: tuple) -> int:
        """Evict up to ``n`` of ``creditor``'s pages ranked below ``value``; return blocks freed. O(n log pages)."""
        cache = self.instances[creditor].cache
        freed = 0
        self._lending = creditor
        try:
            while freed < n:
                cold = self.coldest(creditor)
                if cold is None or not cold < value:
                    break
                got = cache.evict(min(n - freed, cache.peek_victim()[2]))  # a node's pages share its rank
                if not got:
                    break
                freed += got
        finally:
            self._lending = None
        self.evicted_to_lend += freed
        return freed

    @_timed
    def repay(self, debtor: int, slots: np.ndarray) -> None:
        """Give lent blocks back to their creditors."""
        for c, blocks in self._by_creditor(slots):
            for b in blocks.tolist():
                del self.loans[c][b]
                self.values[c].pop(b, None)
            self.debt[debtor, c] -= len(blocks)
            self.instances[c].cache.free(blocks)

    def read(self, slots: np.ndarray) -> Optional[np.ndarray]:
        parts = [(idx, self.instances[c].cache.read(blocks)) for c, blocks, idx in self._by_creditor(slots, True)]
        if not parts or parts[0][1] is None:
            return None
        out = np.empty((len(slots), *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
        for idx, data in parts:
            out[idx] = data
        return out

    def write(self, slots: np.ndarray, pages: np.ndarray) -> None:
        for c, blocks, idx in self._by_creditor(slots, True):
            self.instances[c].cache.write(blocks, pages[idx])

    @_timed
    def recall(self, creditor: int, n: int, below: Optional[tuple] = None) -> int:
        """Free up to ``n`` blocks lent by ``creditor``: move or demote the pages in them; return blocks freed.

        ``below``: recall only loans whose page ranks below it, oldest loan
        first, stopping at the first that does not (loans are made in rank
        order, so this is nearly the coldest ones). O(n) plus the moves.
        """
        if below is None:
            slots = list(self.loans[creditor].items())[:n]
        else:
            values = self.values[creditor]
            slots = []
            for block, debtor in self.loans[creditor].items():
                v = values[block]
                if len(slots) >= n or (v is not None and not v < below):
                    break
                slots.append((block, debtor))
        by_debtor: Dict[int, List[int]] = {}
        for block, debtor in slots:
            by_debtor.setdefault(debtor, []).append(creditor * self.stride + block)
        before = self.lent(creditor)
        for debtor, gids in by_debtor.items():
            moved, demoted = self.instances[debtor].borrowed.recall(gids, creditor)
            self.moved += moved
            self.demoted += demoted
        freed = before - self.lent(creditor)
        self.recalled += freed
        self.heartbeat(creditor)
        return freed

    def _by_creditor(self, slots: np.ndarray, with_index: bool = False):
        creditors = slots // self.stride
        for c in np.unique(creditors).tolist():
            idx = np.flatnonzero(creditors == c)
            blocks = (slots[idx] % self.stride).astype(np.int32)
            yield (c, blocks, idx) if with_index else (c, blocks)

    def check(self) -> None:
        """The ledger equals the loans, every loan is a held block, and no instance both lends and borrows."""
        n = len(self.instances)
        counted = np.zeros((n, n), dtype=np.int64)
        for c, loans in enumerate(self.loans):
            for debtor in loans.values():
                counted[debtor, c] += 1
            if loans:
                blocks = np.fromiter(loans, dtype=np.int32, count=len(loans))
                assert self.instances[c].cache.are_held(blocks), f"instance {c} lent blocks that are not held"
        assert np.array_equal(counted, self.debt), "debt ledger differs from the loans held"
        for c, loans in enumerate(self.loans):
            assert self.values[c].keys() == loans.keys(), f"instance {c}: loan values differ from the loans"
        for i in range(n):
            assert not (self.debt[i].sum() and self.debt[:, i].sum()), f"instance {i} both borrows and lends"


@dataclass(frozen=True, slots=True)
class ClusterResult:
    """Totals of a cluster replay.

    Attributes:
        routing: routing policy; borrowing: whether instances lend memory.
        instances: instance count; num_blocks: HBM blocks per instance.
        requests, prompt_tokens, hit_tokens, token_hit_rate: as :class:`~radixkv.analysis.replay.ReplayResult`.
        hit_tokens_by_tier: hits per tier, summed over instances.
        requests_by_instance: requests each instance served.
        blocks_lent / bytes_lent: blocks lent over the replay (counted per loan) and their bytes.
            Every count is of this replay alone (a cluster replayed twice reports each replay's),
            after its warm-up.
        blocks_recalled, blocks_moved, pages_demoted_on_recall, refusals: recall and refusal counts.
        bytes_by_link: bytes moved per link, summed over instances.
        lending: ``"free"`` or ``"value"`` (see :class:`Cluster`); pages_evicted_to_lend: creditor
            pages evicted to lend their slots.
        borrowed_hit_tokens: tokens served from borrowed memory; borrowed_transfer_seconds: their
            network transfer time (the cost model's ``borrowed`` path), charged per request.
        ttft_saving_seconds: prefill time the hits saved, less every lower-tier load (borrowed included),
            as :class:`~radixkv.analysis.replay.ReplayResult`.
        manager_seconds / manager_us_per_request: wall time in the global manager, total and per request.
        wall_seconds: replay time.
        miss_tokens_by_reason: missed tokens per reason, summed over instances (empty without
            miss reasons); model, hardware, prefill_flops_saved: as ReplayResult; evicted_blocks:
            blocks evicted to make room for requests, summed over instances.
        global_index: whether instances pull pages from each other through the cluster-wide index
            (:class:`~radixkv.global_index.GlobalPageIndex`); peer_hit_tokens / pages_pulled: what
            they pulled (in ``hit_tokens`` and ``hit_tokens_by_tier["peer"]``), from a peer's HBM or
            its host tier; peer_host_hit_tokens: how many of those tokens came from a peer's host
            tier; peer_transfer_seconds: their transfer time (the cost model's ``peer`` path, one
            network hop, and ``peer_host``, the peer's PCIe read then the hop; subtracted from the
            TTFT saving); index_us_per_request: wall time keying and looking up each request in the
            index; index_pages / index_host_pages: distinct pages in the index's HBM / host part at the end.
        store: the shared page store's URL (``None``: none); store_hit_tokens: tokens served from it
            (also in ``hit_tokens_by_tier["store"]``, charged the cost model's ``store`` path);
            store_stats: its counters summed over the instances (round trips, hits, integrity
            misses, backend errors, pages written, ...).
        event_faults: with ``routing="kv_events"``, the faults injected into the event streams
            (``drop=..,duplicate=..,reorder=..,seed=..``; ``None``: none); event_lag: decisions each
            batch took to reach the router (0: before the next); router_false_hit_pages:
            pages the router predicted on the instance it chose that were not served from cache;
            router_missed_pages: pages served from cache it did not predict; router_divergent_pages:
            after the replay's last batches and a replay probe of every stream, pages where the
            router's HBM view differs from the instances' HBM (0: exact); router_us_per_request:
            wall time publishing, applying and routing; router_stats: the streams' counters
            (:meth:`~radixkv.router.inprocess.EventRouting.stats`).
        warmup_requests: requests replayed before counting began (``replay(warmup=...)``).
    """

    routing: str
    borrowing: bool
    instances: int
    num_blocks: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    token_hit_rate: float
    hit_tokens_by_tier: Dict[str, int]
    requests_by_instance: List[int]
    blocks_lent: int
    bytes_lent: int
    blocks_recalled: int
    blocks_moved: int
    pages_demoted_on_recall: int
    refusals: int
    bytes_by_link: Dict[str, int]
    lending: str
    pages_evicted_to_lend: int
    borrowed_hit_tokens: int
    borrowed_transfer_seconds: float
    ttft_saving_seconds: float
    manager_seconds: float
    manager_us_per_request: float
    wall_seconds: float
    miss_tokens_by_reason: Dict[str, int] = field(default_factory=dict)
    model: str = DEFAULT_MODEL
    hardware: str = DEFAULT_HARDWARE
    prefill_flops_saved: int = 0
    evicted_blocks: int = 0
    global_index: bool = False
    store: Optional[str] = None
    store_hit_tokens: int = 0
    store_stats: Dict[str, int] = field(default_factory=dict)
    peer_hit_tokens: int = 0
    pages_pulled: int = 0
    peer_transfer_seconds: float = 0.0
    index_us_per_request: float = 0.0
    index_pages: int = 0
    peer_host_hit_tokens: int = 0
    index_host_pages: int = 0
    event_faults: Optional[str] = None
    event_lag: int = 0
    router_false_hit_pages: int = 0
    router_missed_pages: int = 0
    router_divergent_pages: int = 0
    router_us_per_request: float = 0.0
    router_stats: Dict[str, int] = field(default_factory=dict)
    warmup_requests: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def counts_since(now: Dict[str, int], before: Dict[str, int]) -> Dict[str, int]:
    """``now``'s counters less ``before``'s, key by key (what one replay added). O(keys)."""
    return {k: v - before.get(k, 0) for k, v in now.items()}


def stream_counts(now: Dict[str, int], before: Dict[str, int]) -> Dict[str, int]:
    """A router's stream counters (``router_stats``) of one replay: ``now`` less ``before``, but for
    ``index_pages``, the index's size now. O(counters)."""
    out = counts_since(now, before)
    out["index_pages"] = now["index_pages"]
    return out


def sum_counts(counts: Iterable[Mapping[str, int]]) -> Dict[str, int]:
    """Counters summed by name over ``counts``, in the order names first appear. O(total entries)."""
    totals: Dict[str, int] = {}
    for c in counts:
        for name, value in c.items():
            totals[name] = totals.get(name, 0) + value
    return totals


def store_counters(store) -> Dict[str, int]:
    """What a fleet sums over its instances of a page store's ``stats()`` (empty for ``None``): the store's
    own counters (:data:`~radixkv.store.COUNTERS`) and the pages its backend evicted (``evictions``; a
    backend several stores share counts its evictions once: see :meth:`Cluster._store_stats`). The
    backend's state (its URL, its pages, its capacity) is left out: it is not a sum."""
    if store is None:
        return {}
    stats = store.stats()
    out = {name: stats[name] for name in STORE_COUNTERS}
    out["evictions"] = int(stats.get("evictions", 0))
    return out


def stats_totals(stats: Sequence[ReplayStats]) -> Dict[str, object]:
    """The :class:`ClusterResult` fields that sum the instances' :class:`~radixkv.analysis.stats.ReplayStats`
    (prompt and hit tokens, hit rate, misses by reason, TTFT saving, FLOPs saved, evictions, and the
    model and hardware they were priced for), as keyword arguments. O(instances)."""
    prompt = sum(st.prompt_tokens for st in stats)
    hits = sum(st.hit_tokens for st in stats)
    return dict(prompt_tokens=prompt, hit_tokens=hits, token_hit_rate=hits / prompt if prompt else 0.0,
                ttft_saving_seconds=sum(st.ttft_saving_seconds for st in stats),
                miss_tokens_by_reason=sum_counts(st.miss_tokens_by_reason for st in stats),
                model=stats[0].model.name, hardware=stats[0].hardware.name,
                prefill_flops_saved=sum(st.prefill_flops_saved for st in stats),
                evicted_blocks=sum(st.evicted_blocks for st in stats))


def count_request(stats: ReplayStats, request: Request, hit_tokens: int, new_pages: int, declined: int, evicted: int,
                  other_pages: int, loaded: Optional[Dict[str, int]], index: int, instance: int,
                  on_request: Optional[Callable[[Request, int], None]],
                  on_record: Optional[Callable[[RequestRecord, int], None]]) -> None:
    """Count one served request in the ``stats`` of the ``instance`` that served it, then tell ``on_request``
    and ``on_record`` (its record, ``index`` in trace order), as :meth:`Cluster.replay` documents.

    The one per-request accounting of a fleet, whether its instances live in this process
    (:meth:`Cluster.replay`) or in processes of their own (:mod:`radixkv.fleet`, fed with what
    each process reports). ``loaded``: hit pages per lower tier. Cost: :meth:`ReplayStats.add`.
    """
    record = stats.add(request, hit_tokens, new_pages, declined, evicted, other_pages, loaded_pages=loaded,
                       want_record=on_record is not None)
    if on_request is not None:
        on_request(request, hit_tokens)
    if record is not None:
        on_record(dataclasses.replace(record, index=index), instance)


class Cluster:
    """``num_instances`` caches of ``num_blocks`` HBM blocks each, a global manager, and a router.

    >>> cluster = Cluster(2, num_blocks=8, page_size=2, routing="cache_aware")
    >>> i, a = cluster.admit([1, 2, 3, 4]); a.release()
    >>> cluster.admit([1, 2, 3, 4, 5, 6])[1].hit_tokens     # routed to the instance holding the prefix
    4

    Args:
        num_instances: instances; num_blocks: HBM blocks each; page_size, policy: as PrefixCache.
        host_blocks: host-tier blocks per instance (0: none).
        borrowing: lend spare HBM between instances (Infinite-LLM).
        routing: ``"round_robin"``, ``"least_loaded"``, ``"cache_aware"`` or ``"kv_events"`` (cache-aware
            from the instances' published KV events alone: :class:`~radixkv.router.inprocess.EventRouting`).
        event_faults: with ``"kv_events"``, faults of the event transport (:class:`~radixkv.router.link.EventFaults`
            or its spec ``"drop=0.05,duplicate=0.05,reorder=0.05,seed=0"``).
        event_lag: with ``"kv_events"``, routing decisions each batch of events takes to reach the router:
            request ``i`` is routed knowing the events of the requests before ``i - event_lag`` (0: all
            before it), the view of a router whose events arrive late.
        lend_cap, low_watermark, candidates: creditor rules (see :class:`GlobalManager`).
        lending: ``"value"``: creditors also lend the slots of pages colder than the debtor's, and
            recall only loans colder than their own pages (LRU only: its rank is a last-use time,
            made comparable by one cluster clock); ``"free"``: free blocks only (Infinite-LLM's
            rule; in a full prefix cache that is warm-up only, the default).
        lend_margin: with value lending, how many times older than the debtor's page a creditor's
            page must be to give up its slot (>= 1; see :meth:`GlobalManager._bar`).
        kv_shape, dtype: payloads (``None``: simulation only).
        load_back: as :class:`~radixkv.tiers.TieredCache` (default ``"always"``).
        balance: cache-aware routing considers only instances whose load (prefill tokens
            computed) is at most ``(1 + balance)`` x the least loaded one's plus this request.
        store, store_blocks: a shared page store every instance opens (:func:`~radixkv.tiers.config.open_store`:
            ``"memory"`` for one in-process store of this cluster's, ``memory://NAME``, ``redis://...``),
            read past each instance's own pages and written through at each release; ``store_blocks``
            bounds an in-process one.
        global_index: keep a cluster-wide index of every instance's HBM and host-tier pages
            (:class:`~radixkv.global_index.GlobalPageIndex`): an admission whose pages past its own
            hit another instance holds pulls them from that peer (:attr:`last_pull`) instead of
            computing them, as a hit charged a network transfer (from the peer's host tier, its
            PCIe read as well).
        duplicates: what a pull leaves at its source (:data:`DUPLICATES`): ``"move"`` (the default)
            demotes the source's copy to the next to go in HBM, or in its host tier for a page
            pulled from there (LRU; other policies keep it), ``"copy"`` leaves it as it was.
    """

    def __init__(self, num_instances: int, num_blocks: int, page_size: int = 16, policy: str = "lru", *,
                 host_blocks: int = 0, borrowing: bool = False, routing: str = "round_robin",
                 lend_cap: float = 0.5, low_watermark: float = 0.05, candidates: int = 2,
                 kv_shape: Optional[Sequence[int]] = None, dtype: str = "float16",
                 load_back: str = "always", balance: float = 0.1, lending: str = "free",
                 lend_margin: float = 2.0, global_index: bool = False, store: Optional[str] = None,
                 store_blocks: Optional[int] = None, duplicates: str = "move",
                 event_faults: Union[None, str, EventFaults] = None, event_lag: int = 0) -> None:
        num_instances = check_positive_int(num_instances, "num_instances")
        check_int(event_lag, "event_lag", minimum=0)
        if event_lag and routing != "kv_events":
            raise TierConfigError(f"event_lag needs routing='kv_events', got routing {routing!r}")
        check_positive_int(num_blocks, "num_blocks")
        check_positive_int(host_blocks, "host_blocks", allow_zero=True)
        if routing not in ROUTING:
            raise TierConfigError(f"routing must be one of {', '.join(ROUTING)}, got {routing!r}")
        for name, value in (("lend_cap", lend_cap), ("low_watermark", low_watermark), ("balance", balance),
                            ("lend_margin", lend_margin)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentTypeError(f"{name} must be a number, got {value!r}")
        for name, value in (("lend_cap", lend_cap), ("low_watermark", low_watermark)):
            if not 0 <= value <= 1:
                raise TierConfigError(f"{name} must be a number in [0, 1], got {value!r}")
        check_positive_int(candidates, "candidates")
        if _policies.create(policy).offline and not routes_ahead(routing, num_instances):
            raise TierConfigError(f"policy {policy!r} is offline: it needs each instance's future requests, "
                                  f"known in advance only with round_robin routing or one instance; routing "
                                  f"{routing!r} picks instances by cache state, got num_instances={num_instances}")
        if not balance >= 0:
            raise TierConfigError(f"balance must be a number >= 0, got {balance!r}")
        if event_faults is not None and routing != "kv_events":
            raise TierConfigError(f"event_faults needs routing='kv_events', got routing {routing!r}")
        if isinstance(event_faults, str):
            event_faults = EventFaults.parse(event_faults)
        elif event_faults is not None and not isinstance(event_faults, EventFaults):
            raise ArgumentTypeError(f"event_faults must be an EventFaults or its spec, got {event_faults!r}")
        if duplicates not in DUPLICATES:
            raise TierConfigError(f"duplicates must be one of {', '.join(DUPLICATES)}, got {duplicates!r}")
        self.duplicates = duplicates
        if lending not in LENDING:
            raise TierConfigError(f"lending must be one of {', '.join(LENDING)}, got {lending!r}")
        if lending == "value" and policy not in VALUE_POLICIES:
            raise TierConfigError(f"lending='value' needs a policy whose rank is a last-use time "
                                  f"({', '.join(VALUE_POLICIES)}), got policy {policy!r}")
        if not lend_margin >= 1:
            raise TierConfigError(f"lend_margin must be a number >= 1, got {lend_margin!r}")
        self.lending = lending
        self.balance = balance
        self.routing = routing
        self.borrowing = bool(borrowing)
        self.instances: List[Instance] = []
        self.manager = GlobalManager(self.instances, num_instances, num_blocks, lend_cap, low_watermark, candidates,
                                     by_value=self.borrowing and lending == "value", lend_margin=lend_margin)
        self.store_url = store
        if store == "memory":  # one in-process store for the whole fleet, its own, gone with the cluster
            store = f"memory://radixkv-cluster-{id(self):x}"
            weakref.finalize(self, drop_memory, store[len("memory://"):])
        for i in range(num_instances):
            borrowed = BorrowedTier(self.manager, i) if borrowing else None
            tiers: List[Tier] = [t for t in (borrowed, HostTier(host_blocks, policy) if host_blocks else None) if t]
            shared = (open_store(store, page_size, kv_shape=kv_shape, dtype=dtype, store_blocks=store_blocks)
                      if store is not None else None)
            if store == "mooncake":  # the first instance's store started a master (sized): the others join it
                store, store_blocks = shared.backend.url, None
            cache = TieredCache(num_blocks, page_size, policy, kv_shape, dtype, tiers=tiers, load_back=load_back,
                                store=shared, enable_events=routing == "kv_events")
            self.instances.append(Instance(i, cache, borrowed))
        for i in range(num_instances):
            self.manager.heartbeat(i)
        self._next = 0
        self.page_size = page_size
        self.index: Optional[GlobalPageIndex] = None
        """The cluster-wide page index (``global_index=True``), else ``None``."""
        if global_index:
            self.index = GlobalPageIndex(page_size)
            for inst in self.instances:
                self.index.join(inst.cache)
        self.events: Optional[EventRouting] = None
        """The router fed by the instances' KV events (``routing="kv_events"``), else ``None``."""
        if routing == "kv_events":
            self.events = EventRouting([inst.cache for inst in self.instances], page_size, event_faults,
                                       balance=balance, lag=event_lag)
        self.last_pull = Pull(0, None)
        """What the last :meth:`admit` pulled from a peer."""
        self.pulled_pages = 0
        """Pages pulled from peers since the cluster was made."""
        self.pulled_host_pages = 0
        """How many of them came from a peer's host tier."""
        self.index_seconds = 0.0
        """Wall time spent keying requests and looking them up in the index."""

    # ------------------------------------------------------------------ routing
    def route(self, tokens, namespace: Optional[str] = None) -> int:
        """The instance that should serve ``tokens`` under this cluster's routing policy.

        Validates ``tokens`` and ``namespace`` before anything moves (the round-robin
        cursor included): bad input raises and leaves the cluster as it was.
        """
        tokens = as_tokens(tokens)
        check_namespace(namespace)
        n = len(self.instances)
        if self.routing == "round_robin":
            i = self._next
            self._next = (i + 1) % n
            return i
        if self.routing == "least_loaded":
            return min(range(n), key=lambda i: (self.instances[i].prefill_tokens, i))
        if self.events is not None:
            return self.events.route(tokens, namespace)
        # Cache-aware among instances not overloaded: a prefix every request shares (a system
        # prompt) must not pull the whole trace to one instance.
        floor = min(inst.prefill_tokens for inst in self.instances)
        bound = floor * (1 + self.balance) + len(tokens)
        best = None
        for inst in self.instances:
            if inst.prefill_tokens > bound:
                continue
            hbm, lower = inst.cache.peek(tokens, namespace=namespace)
            key = (-(hbm + lower), inst.prefill_tokens, inst.index)
            if best is None or key < best[0]:
                best = (key, inst.index)
        return best[1]

    def admit(self, tokens, *, namespace: Optional[str] = None,
              on_routed: Optional[Callable[[int], None]] = None) -> Tuple[int, Admission]:
        """Route and admit one request; returns ``(instance index, admission)``. Release it when done.

        ``on_routed(i)`` is called once the request's instance ``i`` is chosen and its recalls are
        done, just before its cache admits it (a replay's miss reasons look at that cache then)."""
        tokens = as_tokens(tokens)  # before routing or recalls change anything
        i = self.route(tokens, namespace)
        inst = self.instances[i]
        cache = inst.cache
        m = self.manager
        if m.by_value:  # one clock: last-use times compare across instances
            cache.advance_clock(m.clock)
        if self.borrowing and m.lent(i):
            cached = sum(cache.peek(tokens, namespace=namespace))
            short = len(tokens) // self.page_size - cached - cache.num_free_blocks
            if short > 0:
                m.recall(i, short, below=m.coldest(i) if m.by_value else None)
        if on_routed is not None:
            on_routed(i)
        index = self.index
        if index is None:
            admission = cache.admit(tokens, namespace=namespace)
            self.last_pull = Pull(0, None)
        else:
            start = time.perf_counter()
            keys = index.request_keys(tokens, namespace)
            index.expect(i, keys)  # the pages i stores now are this request's: no hashing again
            self.index_seconds += time.perf_counter() - start
            try:
                admission = cache.admit(tokens, namespace=namespace)
            finally:
                index.expect(i, None)
            self.last_pull = self._pull(i, admission, tokens, namespace, keys)
        m.clock = max(m.clock, cache.clock)
        if self.events is not None:
            self.events.served(i, admission.hit_tokens // self.page_size)
        inst.requests += 1
        inst.prefill_tokens += len(tokens) - admission.hit_tokens
        self.manager.heartbeat(i)
        return i, admission

    def _pull(self, i: int, admission: Admission, tokens: np.ndarray, namespace: Optional[str],
              keys: List[int]) -> "Pull":
        """After instance ``i`` admitted a request: the pages past its hit that other instances hold
        (in HBM or their host tier) come from one of them that holds them all (in HBM if one does),
        into the head of the admission's new blocks (their payload copied when the caches keep
        one), instead of being computed: the source's written HBM pages first, then its host
        copies (:meth:`~radixkv.tiers.TieredCache.export_pages`)."""
        start = time.perf_counter()
        hit = admission.hit_tokens // self.page_size
        end, source = self.index.longest(keys, hit, exclude=i)
        pages = min(end - hit, admission.num_new_pages)
        if pages <= 0:
            self.index_seconds += time.perf_counter() - start
            return Pull(0, None)
        # Only pages whose KV is written (none an unreleased admission still computes), from the
        # peer's HBM first, then its host tier; with "move" the host copies taken go next there.
        peer = self.instances[source].cache
        moved = self.duplicates == "move"
        got = peer.export_pages(tokens, namespace=namespace, start=hit, max_pages=pages,
                                tiers=self.index.lower_tiers, demote_lower=moved)
        self.index_seconds += time.perf_counter() - start
        pages = got.pages
        if pages <= 0:
            return Pull(0, None)
        if moved and got.hbm_pages:  # the source's copy goes first now: capacity is not spent twice
            peer.demote(tokens[: end * self.page_size], namespace=namespace, start=hit)
        if got.payload is not None:
            self.instances[i].cache.write(admission.new_blocks[:pages], got.payload)
        self.pulled_pages += pages
        self.pulled_host_pages += pages - got.hbm_pages
        return Pull(pages, source, pages - got.hbm_pages)

    def replay(self, requests: Iterable[Request], *,
               on_request: Optional[Callable[[Request, int], None]] = None,
               on_record: Optional[Callable[[RequestRecord, int], None]] = None, miss_reasons: bool = False,
               model: Union[str, ModelSpec] = DEFAULT_MODEL,
               hardware: Union[str, HardwareSpec] = DEFAULT_HARDWARE, warmup: int = 0) -> ClusterResult:
        """Replay ``requests`` in order, each admitted and released at once; return the totals.

        As :func:`~radixkv.analysis.replay.replay`: ``on_request(request, hit_tokens)`` after each
        request (progress), ``on_record(record, instance)`` with its
        :class:`~radixkv.analysis.stats.RequestRecord` (``index`` in trace order) and the instance
        that served it, ``miss_reasons`` to classify every missed token, ``model`` / ``hardware``
        to price the hits. Each instance keeps its own :class:`~radixkv.analysis.stats.ReplayStats`:
        a miss reason is about the instance that served the request (a page cached only on
        another instance is a ``first_sight`` there), and the totals are their sums.

        An offline policy first gets each instance's share of ``requests`` (the
        ones round robin will send it, in order), as
        :func:`~radixkv.analysis.replay.replay` gives one cache the whole trace; with one
        instance the result equals that replay's. ``requests`` is then read into
        a list once.

        ``warmup``: the first ``warmup`` requests fill the caches (routed and served as the others,
        ``on_request`` called, no records) before anything is counted; the result describes warm
        caches, and its records keep their trace-order index. Every count of the result is of the
        counted requests alone. Raises ArgumentValueError for a negative ``warmup``.
        """
        warmup = check_positive_int(warmup, "warmup", allow_zero=True)
        start = time.perf_counter()
        self._peer_seconds = 0.0
        if self.instances[0].cache.policy.offline:
            requests = list(requests)
            self._prepare(requests)
        stats = [ReplayStats(self.page_size, model=model, hardware=hardware, miss_reasons=miss_reasons,
                             tier_costs=inst.cache.cost_model) for inst in self.instances]
        warmed = 0
        if warmup:  # through the same stats, zeroed after it: a page seen in the warm-up is no first sight
            requests = iter(requests)
            try:
                warmed, _, _ = self._replay(itertools.islice(requests, warmup), stats, on_request, None, miss_reasons)
            except BaseException:
                for inst, st in zip(self.instances, stats):
                    st.detach(inst.cache)
                raise
            for st in stats:
                st.reset_counts()
        before = self._counters()
        try:
            count, borrowed_seconds, seconds0 = self._replay(requests, stats, on_request, on_record, miss_reasons,
                                                             first_index=warmed if warmup else 0)
        finally:
            for inst, st in zip(self.instances, stats):
                st.detach(inst.cache)
        events = self.events
        if events is not None:  # the batches still in flight arrive: the view is scored complete
            events.finish()
        now = self._counters()
        own = counts_since(now["own"], before["own"])
        router: Dict[str, object] = {}
        if events is not None:
            scores = counts_since(now["router"], before["router"])
            router = dict(event_faults=events.links[0].faults.spec, event_lag=events.lag,
                          router_false_hit_pages=scores["false_hit_pages"], router_missed_pages=scores["missed_pages"],
                          router_divergent_pages=events.divergent_pages(),
                          router_us_per_request=scores["seconds"] / count * 1e6 if count else 0.0,
                          router_stats=stream_counts(now["streams"], before["streams"]))
        by_tier = counts_since(now["by_tier"], before["by_tier"])
        links: Dict[str, int] = {}
        pulled = own["pulled"]
        if self.index is not None:
            by_tier["peer"] = by_tier.get("peer", 0) + pulled * self.page_size
            links = counts_since(now["links"], before["links"])
        m = self.manager
        lent = counts_since(now["manager"], before["manager"])
        page_bytes = self.instances[0].cache.page_bytes
        return ClusterResult(
            routing=self.routing, borrowing=self.borrowing, instances=len(self.instances),
            num_blocks=self.instances[0].cache.num_blocks, requests=count, hit_tokens_by_tier=by_tier,
            requests_by_instance=[a - b for a, b in zip(now["requests"], before["requests"])],
            blocks_lent=lent["blocks_lent"], bytes_lent=lent["blocks_lent"] * page_bytes,
            blocks_recalled=lent["recalled"], blocks_moved=lent["moved"], pages_demoted_on_recall=lent["demoted"],
            refusals=lent["refusals"], bytes_by_link=links,
            lending=self.lending, pages_evicted_to_lend=lent["evicted_to_lend"],
            borrowed_hit_tokens=by_tier.get("borrowed", 0), borrowed_transfer_seconds=borrowed_seconds,
            manager_seconds=m.seconds - seconds0,
            manager_us_per_request=(m.seconds - seconds0) / count * 1e6 if count else 0.0,
            wall_seconds=time.perf_counter() - start, **stats_totals(stats), global_index=self.index is not None,
            store=self.store_url, store_hit_tokens=by_tier.get("store", 0),
            store_stats=counts_since(now["store"], before["store"]), warmup_requests=warmed if warmup else 0,
            peer_hit_tokens=pulled * self.page_size, pages_pulled=pulled, peer_transfer_seconds=self._peer_seconds,
            peer_host_hit_tokens=own["pulled_host"] * self.page_size,
            index_us_per_request=own["index_seconds"] / count * 1e6 if count else 0.0,
            index_pages=len(self.index) if self.index is not None else 0,
            index_host_pages=self.index.lower_pages if self.index is not None else 0, **router)

    def _replay(self, requests: Iterable[Request], stats: List[ReplayStats], on_request, on_record,
                miss_reasons: bool, first_index: int = 0) -> Tuple[int, float, float]:
        """The loop of :meth:`replay`: (requests replayed, borrowed transfer seconds, manager seconds at start);
        records are numbered from ``first_index`` (the requests a warm-up replayed before)."""
        lower = tuple(self.instances[0].cache.cost_model.tier_paths)
        seconds0 = self.manager.seconds
        count = 0
        borrowed_seconds = peer_seconds = 0.0
        other = [0]

        def routed(i: int) -> None:  # just before instance i admits the request: its other namespaces' pages
            other[0] = stats[i].other_pages(self.instances[i].cache, request) if miss_reasons else 0

        for request in requests:
            before = ([inst.cache.hit_tokens_by_tier for inst in self.instances]
                      if self.borrowing or self.store_url is not None else None)
            counters = [(inst.cache.evicted_blocks, inst.cache.declined_blocks) for inst in self.instances]
            i, a = self.admit(request.tokens, namespace=request.namespace, on_routed=routed)
            a.release()
            cache, st = self.instances[i].cache, stats[i]
            loaded = None
            if before is not None:  # any instance's tiers may move on a recall; only i's serve hits
                loaded = pages_loaded(before[i], cache.hit_tokens_by_tier, lower, self.page_size)
                n = loaded.get("borrowed", 0)
                if n:
                    borrowed_seconds += st.costs.transfer_seconds("borrowed", n * st.costs.page_bytes)
            hit = a.hit_tokens
            pulled, from_host = self.last_pull.pages, self.last_pull.host_pages
            if pulled:  # pages copied from a peer: hits, each charged its share of one transfer on its path
                hit += pulled * self.page_size
                loaded = {**(loaded or {}), "peer": pulled - from_host}
                peer_seconds += st.costs.transfer_seconds("peer", (pulled - from_host) * st.costs.page_bytes)
                if from_host:  # from the peer's host tier: its PCIe read, then the network hop
                    loaded["peer_host"] = from_host
                    peer_seconds += st.costs.transfer_seconds("peer_host", from_host * st.costs.page_bytes)
            count_request(st, request, hit, a.num_new_pages, cache.declined_blocks - counters[i][1],
                          cache.evicted_blocks - counters[i][0], other[0], loaded, first_index + count, i, on_request,
                          on_record)
            count += 1
        self._peer_seconds = peer_seconds
        return count, borrowed_seconds, seconds0

    def _counters(self) -> Dict[str, Any]:
        """The counters kept since the cluster was made that a result reports per replay (a snapshot:
        :meth:`replay` subtracts the one taken before its counted requests). O(instances)."""
        m, e = self.manager, self.events
        return {"by_tier": sum_counts(inst.cache.hit_tokens_by_tier for inst in self.instances),
                "own": {"pulled": self.pulled_pages, "pulled_host": self.pulled_host_pages,
                        "index_seconds": self.index_seconds},
                "router": {} if e is None else {"false_hit_pages": e.false_hit_pages, "missed_pages": e.missed_pages,
                                                "seconds": e.seconds},
                "streams": {} if e is None else e.stats(),
                "requests": [inst.requests for inst in self.instances],
                "links": sum_counts(inst.cache.transfers.bytes_by_link for inst in self.instances),
                "store": self._store_stats(),
                "manager": {"blocks_lent": m.blocks_lent, "recalled": m.recalled, "moved": m.moved,
                            "demoted": m.demoted, "refusals": m.refusals, "evicted_to_lend": m.evicted_to_lend}}

    def _store_stats(self) -> Dict[str, int]:
        """The instances' page-store counters, summed (empty without a store); the evictions of each backend
        once (the instances of an in-process store share one)."""
        stores = [inst.cache.store for inst in self.instances if inst.cache.store is not None]
        out = sum_counts(store_counters(store) for store in stores)
        if stores:
            backends = {id(store.backend): store for store in stores}
            out["evictions"] = sum(store_counters(store)["evictions"] for store in backends.values())
        return out

    def crash(self, index: int) -> int:
        """Instance ``index`` loses its memory and restarts empty; return the pages its debtors lost.

        Every debtor forgets the pages held in blocks it lent, with the pages
        below them (:meth:`BorrowedTier.forget`): the debt is written off, never
        served from memory that is gone. Its own cache is emptied (HBM, host,
        and its borrowed pages, repaid to their creditors). Raises
        :class:`~radixkv.errors.LockError`, changing nothing, while one of its
        admissions is open. Its tier counters restart too. Cost: O(pages it lent + its cache).
        """
        index = check_positive_int(index, "index", allow_zero=True)
        if index >= len(self.instances):
            raise ArgumentValueError(f"index must be < {len(self.instances)} (the instances), got {index!r}")
        inst = self.instances[index]
        error = None  # a tier policy that raises: the crash completes, then the first error
        try:
            inst.cache.reset()  # raises LockError before any change while pages are locked
        except LockError:
            raise
        except BaseException as exc:  # (the reset itself completed: every copy forgotten)
            error = exc
        lost = 0
        for debtor in np.flatnonzero(self.manager.debt[:, index]).tolist():
            try:
                lost += self.instances[debtor].borrowed.forget(index)
            except BaseException as exc:
                error = error or exc
        self.manager.heartbeat(index)
        if error is not None:
            raise error
        return lost

    def _prepare(self, requests: List[Request]) -> None:
        """Give each instance's offline policy the requests round robin will route to it, from the cursor on."""
        n = len(self.instances)
        for k, inst in enumerate(self.instances):
            share = requests[(k - self._next) % n::n]
            inst.cache.policy.prepare(share, self.page_size, inst.cache.clock + 1)

    def check(self) -> None:
        """Every instance's :meth:`~radixkv.tiers.TieredCache.check` (write-back: it asserts no stranded
        copy, borrowed ones included), the ledger, and the cluster-wide index (it must equal the union
        of the instances' HBM pages, and of their host-tier pages). O(n)."""
        for inst in self.instances:
            inst.cache.check()
        self.manager.check()
        if self.events is not None:
            self.events.index.check()
        if self.index is not None:
            self.index.check()
