"""Segmented LRU: leaves never reused since they were cached go first, LRU within each segment.

A node is *protected* once it has been used ``protected_threshold`` times
(insert counts as the first use, so the default 2 means "hit at least once
after being cached"); otherwise it is *probationary*. Priority is
``(segment, last use)``, so every probationary leaf is evicted before any
protected one. As in SGLang's ``SLRUStrategy`` the protected segment has no
size cap (a capped segment would need to demote its LRU node, a rank
*decrease* the lazy victim queue cannot express). Source: Karedla et al.,
"Caching strategies to improve disk system performance" (1994); SGLang
``mem_cache/evict_policy.py``.
"""

from __future__ import annotations

from radixkv.errors import ArgumentValueError
from radixkv.tree import Node

from .base import EvictionPolicy, pack


class SLRU(EvictionPolicy):
    """Two segments by use count; ``policy_state`` is ``(uses, last_use)``."""

    name = "slru"

    def __init__(self, protected_threshold: int = 2) -> None:
        if protected_threshold.__class__ is not int or protected_threshold < 1:
            raise ArgumentValueError(f"protected_threshold must be an int >= 1, got {protected_threshold!r}")
        self.protected_threshold = protected_threshold

    def on_insert(self, node: Node, now: int) -> None:
        node.policy_state = (1, now)

    def on_access(self, node: Node, now: int) -> None:
        node.policy_state = (node.policy_state[0] + 1, now)

    def priority(self, node: Node) -> int:
        uses, last = node.policy_state
        return pack(uses >= self.protected_threshold, last)
