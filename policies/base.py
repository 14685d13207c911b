"""The eviction-policy interface.

A policy ranks; it does no accounting. The engine calls its hooks when a node
enters the tree, is used, loses pages or leaves, and asks for a node's
``priority``: among evictable leaves, the lowest priority goes first (ties:
the deepest page first). The engine owns the victim queue, counters, locks and
memory; a policy only keeps its own state, in itself or in the node's one
opaque slot ``node.policy_state``.

Priorities must not change without a hook call on that node: the engine
re-ranks a leaf only after ``on_insert``/``on_access``/``on_truncate``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from radixkv.tree import Node


class EvictionPolicy:
    """Base class: subclasses set ``name`` and override ``priority`` and the hooks they need."""

    name: ClassVar[str] = ""

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
        """Pages of ``node`` are about to be evicted at ``priority`` (aging policies use it)."""

    def on_remove(self, node: Node) -> None:
        """``node`` left the tree."""

    def admit(self, node_parent: Node, num_pages: int, now: int) -> int:
        """How many of ``num_pages`` new pages below ``node_parent`` to cache (all, by default)."""
        return num_pages

    def priority(self, node: Node) -> Any:
        """Rank of ``node`` among evictable leaves; lowest is evicted first. Must be cheap."""
        raise NotImplementedError
