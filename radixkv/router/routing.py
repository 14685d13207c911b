"""KVRouter: pick an instance for a request from what the instances published, and their load.

The router hashes a request's full pages as a default vLLM does (:class:`~radixkv.events.hashing.BlockHasher`,
``cache_salt`` as the namespace), asks its :class:`~radixkv.router.index.KVIndex` how many leading
pages each instance holds and on which medium, and weighs them (an HBM page saves a prefill
outright, a host or disk page still costs a load). Load is what the router itself sent: requests
in flight (routed, not :meth:`~KVRouter.done`) and the prefill tokens it expects each instance to
compute (prompt tokens past the predicted hit), so it needs no report from the engines.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError
from ..events.hashing import BlockHasher, external_block_hash_array
from ..keys import as_tokens, check_namespace, check_positive_int
from .index import BlockKey, KVIndex, Medium

DEFAULT_MEDIUM_WEIGHTS: Dict[str, float] = {"GPU": 1.0, "CPU": 0.8, "STORAGE": 0.5}
"""Worth of a page by where it sits: HBM saves the whole prefill of the page, host memory a
little less (the page must be copied back), storage less again. Keys are a medium (``"CPU"``)
or a medium and locality (``"STORAGE/REMOTE"``, which wins over ``"STORAGE"``); a page whose
medium is ``None`` counts as ``"GPU"``."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes and why.

    Attributes:
        instance: the instance chosen.
        overlap_pages: leading pages of the request the index says it holds (any medium).
        weighted_overlap: those pages weighted by medium.
        num_pages: the request's full pages.
    """

    instance: Hashable
    overlap_pages: int
    weighted_overlap: float
    num_pages: int


class KVRouter:
    """Routes requests by predicted cache hits (from a :class:`KVIndex`) and load.

    >>> from radixkv.events import BlockStored
    >>> from radixkv.events.wire import encode_batch
    >>> index = KVIndex()
    >>> router = KVRouter(index, ["a", "b"], page_size=2)
    >>> hashes = router.block_hashes([1, 2, 3, 4])
    >>> _ = index.apply("b", 0, encode_batch([BlockStored(hashes, None, [1, 2, 3, 4], 2)]))
    >>> router.route([1, 2, 3, 4, 5]).instance
    'b'

    The rule is cache-aware routing's: among instances whose expected prefill load is at most
    ``(1 + balance)`` x the least loaded one's plus this request, the most weighted overlap,
    then the fewest requests in flight, the least prefill load, the first in ``instances``
    order. Cost: hashing the request's pages (about 1.5 us a page) plus one lookup per page of
    the longest held prefix and O(instances).

    Args:
        index: the view of the instances' pages.
        instances: the instances to route to (one with no events yet is routed to as empty).
        page_size: tokens per page (the instances' block size).
        hasher: the hash function and seed the instances use (default: vLLM's).
        medium_weights: see :data:`DEFAULT_MEDIUM_WEIGHTS`; a medium not named is worth ``default_weight``.
        balance: the load bound above.
    """

    def __init__(self, index: KVIndex, instances: Sequence[Hashable] = (), *, page_size: int = 16,
                 hasher: Optional[BlockHasher] = None, medium_weights: Optional[Mapping[str, float]] = None,
                 default_weight: float = 0.5, balance: float = 0.1) -> None:
        if not isinstance(index, KVIndex):
            raise ArgumentTypeError(f"index must be a KVIndex, got {index!r}")
        self.page_size = check_positive_int(page_size, "page_size")
        if hasher is not None and not isinstance(hasher, BlockHasher):
            raise ArgumentTypeError(f"hasher must be a BlockHasher, got {hasher!r}")
        weights = dict(DEFAULT_MEDIUM_WEIGHTS if medium_weights is None else medium_weights)
        for name, value in [*weights.items(), ("default_weight", default_weight), ("balance", balance)]:
            if not isinstance(name, str):
                raise ArgumentTypeError(f"medium_weights keys must be str, got {name!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ArgumentValueError(f"{name} must be a number >= 0, got {value!r}")
        instances = list(instances)
        if len(set(instances)) != len(instances):
            raise ArgumentValueError(f"instances must be distinct, got {instances!r}")
        self.index = index
        self.hasher = hasher if hasher is not None else BlockHasher()
        self.medium_weights = weights
        self.default_weight = float(default_weight)
        self.balance = float(balance)
        self._instances: List[Hashable] = []
        self.in_flight: Dict[Hashable, int] = {}
        """Requests routed to each instance and not yet :meth:`done`."""
        self.prefill_tokens: Dict[Hashable, int] = {}
        """Prompt tokens past the predicted hit of every request routed to each instance."""
        self._weights: Tuple[int, List[float]] = (-1, [])
        self._subscriptions: List["Subscription"] = []
        self._lock = threading.Lock()
        for inst in instances:
            self.add(inst)

    @property
    def instances(self) -> List[Hashable]:
        """The instances routed to, in tie-break order."""
        return list(self._instances)

    def add(self, instance: Hashable) -> None:
        """Route to ``instance`` too (no-op if it is known). O(1)."""
        self.index.add(instance)
        with self._lock:
            if instance not in self.in_flight:
                self._instances.append(instance)
                self.in_flight[instance] = 0
                self.prefill_tokens[instance] = 0

    def weight(self, medium: Medium) -> float:
        """Worth of a page on ``medium`` (a ``(medium, locality)`` pair). O(1)."""
        name, locality = medium
        name = "GPU" if name is None else name
        w = self.medium_weights.get(f"{name}/{locality}") if locality is not None else None
        if w is None:
            w = self.medium_weights.get(name, self.default_weight)
        return float(w)

    def block_hashes(self, tokens, cache_salt: Optional[str] = None) -> List[BlockKey]:
        """The hashes the instances publish for the full pages of ``tokens`` under ``cache_salt``. O(len(tokens))."""
        check_namespace(cache_salt)
        return self.hasher.event_hashes(self.hasher.hash_pages(as_tokens(tokens), self.page_size, namespace=cache_salt))

    def route(self, tokens, cache_salt: Optional[str] = None) -> Route:
        """Choose the instance for a request (``tokens``, under ``cache_salt``) and count it as in flight there.

        Raises :class:`~radixkv.errors.ArgumentValueError` when no instance is known, and on
        bad tokens or salt, changing nothing.
        """
        tokens = as_tokens(tokens)
        check_namespace(cache_salt)
        digests = self.hasher.hash_pages(tokens, self.page_size, namespace=cache_salt)
        keys = external_block_hash_array(digests) if self.hasher.use_int_block_hashes else None
        return self.route_hashes(self.hasher.event_hashes(digests) if keys is None else keys, len(tokens))

    def route_hashes(self, hashes: Union[Sequence[BlockKey], np.ndarray], num_tokens: int) -> Route:
        """:meth:`route` for a request already hashed (``hashes`` as :meth:`block_hashes` gives them, or
        their uint64 array; ``num_tokens`` prompt tokens)."""
        if not self._instances:
            raise ArgumentValueError("the router knows no instance: add() or subscribe() one first")
        media = self.index.media
        if self._weights[0] != len(media):
            self._weights = (len(media), [self.weight(m) for m in media])
        pages, worth = self.index.runs(hashes, self._weights[1])
        slot = self.index.slot
        with self._lock:
            floor = min(self.prefill_tokens.values())
            bound = floor * (1 + self.balance) + num_tokens
            best = None
            for pos, inst in enumerate(self._instances):
                load = self.prefill_tokens[inst]
                if load > bound:
                    continue
                s = slot(inst)
                key = (-worth.get(s, 0.0), self.in_flight[inst], load, pos)
                if best is None or key < best[0]:
                    best = (key, inst, pages.get(s, 0))
            _, inst, overlap = best
            self.in_flight[inst] += 1
            self.prefill_tokens[inst] += max(0, num_tokens - overlap * self.page_size)
        return Route(inst, overlap, -best[0][0], len(hashes))

    def done(self, instance: Hashable) -> None:
        """A request routed to ``instance`` finished. Raises if none is in flight there. O(1)."""
        with self._lock:
            if self.in_flight.get(instance, 0) <= 0:
                raise ArgumentValueError(f"no request is in flight on instance {instance!r}")
            self.in_flight[instance] -= 1

    # ------------------------------------------------------------ live event streams
    def subscribe(self, endpoint: str, instance: Hashable, replay_endpoint: Optional[str] = None, *,
                  topic: str = "", idle_probe: Optional[float] = 1.0,
                  faults: Optional["EventFaults"] = None) -> "Subscription":
        """Follow ``instance``'s events on the ZMQ PUB ``endpoint`` on a thread of its own (see
        :class:`~radixkv.router.subscriber.Subscription`: ``topic``, ``idle_probe``, ``faults``), filling
        gaps from ``replay_endpoint`` (the publisher's ROUTER socket; ``None``: a gap is declared lost
        at once). Needs pyzmq."""
        from .subscriber import Subscription

        self.add(instance)
        sub = Subscription(self.index, endpoint, instance, replay_endpoint, topic=topic, idle_probe=idle_probe,
                           faults=faults)
        self._subscriptions.append(sub)
        return sub

    def close(self) -> None:
        """Stop every subscription's thread and close its sockets. Idempotent."""
        for sub in self._subscriptions:
            sub.close()
        self._subscriptions.clear()

    def __enter__(self) -> "KVRouter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KVRouter(instances={self._instances!r}, page_size={self.page_size}, index={self.index!r})"


if TYPE_CHECKING:  # pragma: no cover
    from .link import EventFaults
    from .subscriber import Subscription

__all__ = ["DEFAULT_MEDIUM_WEIGHTS", "KVRouter", "Route"]
