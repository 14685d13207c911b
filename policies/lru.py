"""Least recently used: evict the leaf whose last use is oldest.

Priority is the logical time of the node's last match or insert; the engine
breaks ties deepest page first, so a leaf's tail goes before its parent's
pages. This is the policy of SGLang's radix cache and vLLM's block pool.
"""

from __future__ import annotations

from radixkv.tree import Node

from .base import EvictionPolicy


class LRU(EvictionPolicy):
    """Least recently used (the base hooks already record last access in ``policy_state``)."""

    name = "lru"

    def priority(self, node: Node) -> int:
        return node.policy_state
