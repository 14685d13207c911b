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
re-ranks a leaf only after ``on_insert``/``on_access``/``on_truncate`` (and
after a spared :meth:`EvictionPolicy.on_victim`). The queue invalidates
lazily, so a rank may only be *raised* outside those calls, never lowered.

**Why one more hook, ``on_victim``.** A static priority cannot express two
things some policies need: a *second chance* (SIEVE, S3-FIFO and CLOCK look
at the candidate and keep it if it was used since they last looked), and
*per-page* ranks inside a node (Belady's next use differs from page to page,
so a leaf may only lose the tail pages that share its tail page's rank). So
the engine, when a leaf surfaces as the next victim, asks
``on_victim(node)`` how many tail pages may go at this rank: ``0`` spares
the leaf (the policy has raised its rank; the engine re-queues it and looks
again), ``k >= 1`` evicts up to ``k`` pages, then the leaf is re-ranked.
Policies that do not override it (``on_victim is None``) pay nothing and
lose whole leaf tails at once. Victim selection stays O(log n) amortized: a
spare is one heap push, and each spare must be paid for by an earlier access
(a policy must return ``>= 1`` after finitely many spares of the same leaf).

**Histories are per namespace.** A policy that remembers pages after they
leave the tree (a ghost) keys them with :func:`history_key`, which includes
the namespace (:func:`radixkv.tree.namespace_of`): otherwise one tenant's evictions would
decide how another tenant's identical page is ranked, and the rank (seen as
hit or miss timing) would tell that tenant what the other one cached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Hashable, Optional

from radixkv.tree import Node

if TYPE_CHECKING:  # pragma: no cover
    from radixkv.cache import PrefixCache


class EvictionPolicy:
    """Base class: subclasses set ``name`` and override ``priority`` and the hooks they need.

    Class attributes:
        name: registry name.
        aliases: other names :func:`radixkv.policies.create` accepts.
        offline: True for policies that must see the future request sequence
            (:meth:`prepare`) before a replay; replay calls it for them.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple] = ()
    offline: ClassVar[bool] = False

    #: Optional victim-loop hook (see the module docstring); ``None`` means
    #: "evict the whole tail run at once" and costs nothing.
    on_victim: Optional[Callable[[Node], int]] = None

    def attach(self, cache: "PrefixCache") -> None:
        """Called once by :class:`PrefixCache` with the cache this policy serves (page size, cost model)."""

    def on_insert(self, node: Node, now: int) -> None:
        """``node`` was created holding pages first cached at logical time ``now``."""
        node.policy_state = now

    def on_access(self, node: Node, now: int) -> None:
        """A request matched (or re-inserted) all of ``node``'s pages at ``now``."""
        node.policy_state = now

    def on_split(self, upper: Node, lower: Node) -> None:
        """``lower`` was cut; ``upper`` holds its first pages (already a copy of its state)."""

    def on_truncate(self, node: Node) -> None:
        """``node`` lost tail pages to eviction and stays in the tree."""

    def on_evict(self, node: Node, priority: Any) -> None:
        """Tail pages of ``node`` are about to be evicted at ``priority`` (aging policies use it)."""

    def on_remove(self, node: Node) -> None:
        """``node`` left the tree."""

    def admit(self, node_parent: Node, num_pages: int, now: int, pages: memoryview) -> int:
        """How many of ``num_pages`` new pages below ``node_parent`` to cache (all, by default).

        ``pages`` is a read-only view of the new pages' token bytes
        (``num_pages * page_size`` uint32 values). Called before the engine
        evicts anything for them, so declined pages cost no eviction. Returns
        the length of the prefix of the new pages to keep.
        """
        return num_pages

    def priority(self, node: Node) -> Any:
        """Rank of ``node`` among evictable leaves; lowest is evicted first. Must be cheap."""
        raise NotImplementedError


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
