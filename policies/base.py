"""The eviction-policy interface.

A policy ranks; it does no accounting. The engine calls its hooks when a node
enters the tree, is used, loses pages or leaves, and asks for a node's
``priority``: among evictable leaves, the lowest priority goes first (ties:
the deepest page first). The engine owns the victim queue, counters, locks and
memory; a policy only keeps its own state, in itself or in the node's one
opaque slot ``node.policy_state``.

The engine's victim key is ``(node.retention, policy.priority(node), -depth)``:
retention classes (``PrefixCache.admit(..., priority=p)``) come first, so any
policy evicts a lower class before a higher one.

Priorities must not change without a hook call on that node: the engine
re-ranks a leaf only after ``on_insert``/``on_access``/``on_split`` (and
after a spared :meth:`EvictionPolicy.on_victim`, and once pages left it).
The queue invalidates lazily, so a rank may only be *raised* outside those
calls, never lowered.

**The hooks.** ``on_insert``, ``on_access`` and ``on_split`` tell what
entered or was used; :meth:`EvictionPolicy.on_evict` is the one notice
that pages leave: the node, how many of its tail pages, and the rank they
were evicted at (``None`` when they leave otherwise: a reset, an aborted
admission, a lower tier's copy promoted or lost). It replaces the earlier
``on_evict(node, priority)``, ``on_truncate(node)`` and ``on_remove(node)``:
the range it carries is what those three pieced together. ``priority``
ranks. Two capabilities are optional, and the engine tests for them once:
``admit`` (admission control; ``None`` unless a policy defines it) and
offline preparation (the :class:`Offline` mixin: ``prepare`` learns the
future before a replay).

**Why one more hook, ``on_victim``.** A static priority cannot express two
things some policies need: a *second chance* (SIEVE, S3-FIFO and CLOCK look
at the candidate and keep it if it was used since they last looked), and
*per-page* ranks inside a node (Belady's next use differs from page to page,
so a leaf may only lose the tail pages that share its tail page's rank). So
the victim loop (:func:`radixkv.victims.evict`), when a leaf surfaces as the
next victim, asks ``on_victim(node)`` how many tail pages may go at this
rank: ``0`` spares the leaf (the policy has raised its rank; the engine
re-queues it and looks again), ``k >= 1`` evicts up to ``k`` pages, then the
leaf is re-ranked. Policies that do not override it (``on_victim is None``)
pay nothing and lose whole leaf tails at once. Victim selection stays
O(log n) amortized: a spare is one heap push, and each spare must be paid
for by an earlier access (a policy must return ``>= 1`` after finitely many
spares of the same leaf).

**Hooks should not raise; if one does, the engine stays consistent where it
can.** An ``on_insert`` that raises (or a ``priority`` that raises while the
new node is ranked) undoes the insert: the new pages leave the cache again
(their KV was never written), an admission never happened and an insert's
caller keeps its blocks. An ``on_evict`` raising in an abort is re-raised
once the abort is complete. A leaf whose ``priority`` raised while it was
re-ranked leaves the victim queue for a pending set that the next eviction
ranks first (raising again while the policy does): it is never lost track of.

**Lanes: choosing the victim among candidates.** A static key cannot
express "evict the page whose score is lowest *now*" when scores move with
age, each class along its own curve (hit density). A policy that sets
``lanes = L >= 1`` splits the engine's victim queue into ``L`` lanes
(:class:`radixkv.victims.LaneQueue`): ``lane(node)`` (``0 <= lane < L``,
read whenever the leaf is ranked, so it may change only where the priority
may) says which lane a leaf queues in, ``priority`` orders each lane, and
when the loop needs a victim the engine hands ``choose(nodes)`` the head of
every non-empty lane (of the lowest retention class) and evicts the one at
the index it returns; ``on_victim`` applies to that leaf as usual. Cost
O(L) per victim, on top of the queue's O(log n); a policy with ``lanes = 0``
(every built-in but ``density`` and ``wa``, which subclasses it) keeps one
queue and pays nothing. A lower tier splits its queue the same way.

**What a policy may know of a request.** ``on_request(num_pages, hints,
now)``, when a policy defines it, is called by ``PrefixCache.admit`` before
the request is matched: its length in full pages and the
:class:`RequestHints` the caller passed (``admit(..., hints=...)``; replay
passes the trace's fields), ``None`` when it passed none. The ``on_insert``
and ``on_access`` calls of that admission follow at the same ``now``, so a
policy can class the request's pages by its length, their position in it,
the output length or the session fields. ``None`` unless a policy defines it.

**Histories are per namespace.** A policy that remembers pages after they
leave the tree (a ghost) keys them with :func:`history_key`, which includes
the namespace (:func:`radixkv.tree.namespace_of`): otherwise one tenant's evictions would
decide how another tenant's identical page is ranked, and the rank (seen as
hit or miss timing) would tell that tenant what the other one cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Hashable, Optional, Sequence

from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.tree import Node

if TYPE_CHECKING:  # pragma: no cover
    from radixkv.cache import PrefixCache
    from radixkv.workload.traces import Request


@dataclass(frozen=True, slots=True)
class RequestHints:
    """What an engine (or a trace) knows of a request besides its tokens; every field optional.

    The fields are those of the Mooncake and Alibaba Bailian trace formats.
    Policies may use them to class a request's pages (:class:`~.wa.WorkloadAware`
    uses ``type`` and ``turn`` as its workload category); none is required.

    Attributes:
        output_length: tokens the request generated (or is expected to), ``>= 0``.
        timestamp: arrival time in seconds (finite).
        chat_id: the request's session turn id (Bailian ``chat_id``).
        parent_chat_id: the ``chat_id`` this turn continues (``-1`` or ``None``: a first turn).
        turn: turn number within its session, ``>= 1``.
        type: request category (Bailian ``type``: ``"text"``, ``"image"``, ...).

    Bad values raise :class:`~radixkv.errors.ArgumentTypeError` /
    :class:`~radixkv.errors.ArgumentValueError` naming the field.
    """

    output_length: Optional[int] = None
    timestamp: Optional[float] = None
    chat_id: Optional[int] = None
    parent_chat_id: Optional[int] = None
    turn: Optional[int] = None
    type: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("output_length", "chat_id", "parent_chat_id", "turn"):
            value = getattr(self, name)
            if value is not None and (value.__class__ is bool or not isinstance(value, int)):
                raise ArgumentTypeError(f"hints.{name} must be an int or None, got {value!r}")
        if self.output_length is not None and self.output_length < 0:
            raise ArgumentValueError(f"hints.output_length must be >= 0, got {self.output_length!r}")
        if self.turn is not None and self.turn < 1:
            raise ArgumentValueError(f"hints.turn must be >= 1, got {self.turn!r}")
        ts = self.timestamp
        if ts is not None:
            if ts.__class__ is bool or not isinstance(ts, (int, float)):
                raise ArgumentTypeError(f"hints.timestamp must be a number or None, got {ts!r}")
            if not math.isfinite(ts):
                raise ArgumentValueError(f"hints.timestamp must be finite, got {ts!r}")
        if self.type is not None and not isinstance(self.type, str):
            raise ArgumentTypeError(f"hints.type must be a str or None, got {self.type!r}")


class EvictionPolicy:
    """Base class: subclasses set ``name`` and override ``priority`` and the hooks they need.

    Class attributes:
        name: registry name.
        aliases: other names :func:`radixkv.policies.create` accepts.
        offline: True for policies that must see the future request sequence
            before a replay (set by :class:`Offline`).
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple] = ()
    offline: ClassVar[bool] = False

    #: Optional victim-loop hook (see the module docstring); ``None`` means
    #: "evict the whole tail run at once" and costs nothing.
    on_victim: Optional[Callable[[Node], int]] = None

    #: Optional admission control, ``admit(node_parent, num_pages, now, pages) -> int``: how many
    #: of ``num_pages`` new pages below ``node_parent`` to cache (the length of the prefix of
    #: them to keep). ``pages`` is a read-only view of the new pages' token bytes
    #: (``num_pages * page_size`` uint32 values). Called before the engine evicts anything for
    #: them, so declined pages cost no eviction. ``None``: every new page is cached, at no cost.
    admit: Optional[Callable[[Node, int, int, memoryview], int]] = None

    #: Lanes of the victim queue (see the module docstring); ``0``: one queue ranked by
    #: :meth:`priority` alone, and :meth:`lane` and :meth:`choose` are never called.
    lanes: int = 0

    def lane(self, node: Node) -> int:
        """With ``lanes >= 1``: the lane ``node`` queues in, ``0 <= lane < lanes``. Must be cheap."""
        return 0

    def choose(self, heads: Sequence[Node]) -> int:
        """With ``lanes >= 1``: the index in ``heads`` (the heads of two or more non-empty lanes,
        one retention class) of the leaf to evict next. O(len(heads)) expected."""
        return 0

    #: Optional request notice, ``on_request(num_pages, hints, now)``: see the module docstring.
    on_request: Optional[Callable[[int, Optional[RequestHints], int], None]] = None

    def attach(self, cache: "PrefixCache") -> None:
        """Called once by :class:`PrefixCache` with the cache this policy serves (page size, cost model)."""

    def claim(self) -> None:
        """Claim the policy for one cache or tier (the engine calls this before :meth:`attach`).

        A policy's history (ghosts, learned windows, clocks) is about the pages of the one
        cache it serves: shared by two, one cache's evictions would rank the other's pages
        (a side channel between them). A second claim raises
        :class:`~radixkv.errors.ArgumentValueError`; give each cache its own instance. O(1).
        """
        if self.__dict__.get("_claimed"):
            raise ArgumentValueError(f"the policy {self!r} serves another cache or tier already; give each its own")
        self.__dict__["_claimed"] = True

    def unclaim(self) -> None:
        """Give up :meth:`claim` when the cache or tier that claimed the policy was refused while
        it was being built (it served no page): the corrected call may claim it again. O(1)."""
        self.__dict__.pop("_claimed", None)

    def on_insert(self, node: Node, now: int) -> None:
        """``node`` was created holding pages first cached at logical time ``now``."""
        node.policy_state = now

    def on_access(self, node: Node, now: int) -> None:
        """A request matched (or re-inserted) all of ``node``'s pages at ``now``."""
        node.policy_state = now

    def on_split(self, upper: Node, lower: Node) -> None:
        """``lower`` was cut; ``upper`` holds its first pages (already a copy of its state)."""

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        """The last ``pages`` pages of ``node`` (depths ``node.end - pages`` to ``node.end``) leave.

        Called while ``node`` still holds them; ``node`` leaves with them when
        ``pages == node.num_pages``, else it keeps its other pages and is
        re-ranked. ``rank`` is the priority the victim was queued with (aging
        policies raise their clock to it), or ``None`` when the pages leave
        without being chosen as victims (a reset, an aborted admission, a
        lower tier's copy moving up or lost).
        """

    def priority(self, node: Node) -> Any:
        """Rank of ``node`` among evictable leaves; lowest is evicted first. Must be cheap."""
        raise NotImplementedError


class Offline:
    """Capability mixin (``class P(Offline, EvictionPolicy)``): the policy needs the future.

    Replay (and a cluster whose routing is known ahead) calls :meth:`prepare`
    with the whole request sequence first; lower tiers refuse such a policy.
    """

    offline: ClassVar[bool] = True

    def prepare(self, requests: Sequence["Request"], page_size: int, first_clock: int = 1) -> None:
        """Learn the future: ``requests`` will be admitted at clock values ``first_clock, first_clock+1, ...``."""
        raise NotImplementedError


PACK_BITS = 40
"""Low bits of :func:`pack`: clocks and counters stay below ``2**40``."""


def pack(high: int, low: int) -> int:
    """``(high, low)`` as one int with the same order (``0 <= low < 2**PACK_BITS``); one int
    compares faster than a tuple and costs one object. O(1)."""
    return high << PACK_BITS | low


def gap_bin(gap: int, bins: int) -> int:
    """Histogram bin of a reuse gap of ``gap`` clock ticks: bin 0 holds gap 0, bin ``j >= 1``
    gaps in ``[2^((j-1)/2), 2^(j/2))``, the last bin everything longer. O(1)."""
    return 0 if gap <= 0 else min(bins - 1, 1 + int(2 * math.log2(gap)))


def tail_past(node: Node, boundary: int) -> int:
    """Tail pages of ``node`` deeper than ``boundary`` (every page when the boundary is not inside it).

    For :meth:`EvictionPolicy.on_victim` of policies whose leaves hold two
    classes of pages: the deeper class goes first, at its own rank.
    """
    return node.end - boundary if node.start < boundary < node.end else node.num_pages


def history_key(namespace: Hashable, depth: int, page: bytes) -> Hashable:
    """The key under which a policy remembers page ``depth`` (token bytes ``page``) of a chain in ``namespace``.

    The depth and page are hashed (a history is approximate: a collision
    confuses two pages of one namespace); the namespace stays outside the
    hash, so the keys of two namespaces are never equal. The default
    namespace's key is the bare hash (no tuple per entry). O(page bytes).
    """
    key = hash((depth, page))
    return key if namespace is None else (namespace, key)
