"""LFU with dynamic aging (LFU-DA): evict the leaf with the smallest ``L + frequency``.

``frequency`` counts the node's uses (insert and every match); ``L`` is the
policy's age, raised to the value of each evicted leaf, and added to a
node's value when it is used. Old popularity therefore decays: a node that
was hot long ago keeps a value from an old, small ``L`` and is outranked by
recently used ones. Ties: least recently used first, then deepest page.
With ``aging=False``, ``L`` stays 0: plain LFU, ranking by (frequency, last
use) as SGLang's ``LFUStrategy`` does.
Source: Arlitt et al., "Evaluating content management techniques for Web
proxy caches" (2000), LFU-DA.
"""

from __future__ import annotations

from typing import Any

from radixkv.errors import ArgumentTypeError
from radixkv.tree import Node

from .base import PACK_BITS, EvictionPolicy, pack


class LFU(EvictionPolicy):
    """LFU-DA (plain LFU with ``aging=False``). ``policy_state`` is ``(value, frequency, last_use)``."""

    name = "lfu"
    aliases = ("lfu-da",)

    def __init__(self, aging: bool = True) -> None:
        if aging.__class__ is not bool:
            raise ArgumentTypeError(f"aging must be a bool, got {aging!r}")
        self.aging = aging
        """Whether ``L`` follows evictions (LFU-DA) or stays 0 (plain LFU)."""
        self.age = 0
        """``L``: the value of the last evicted leaf (monotonic; 0 without aging)."""

    def on_insert(self, node: Node, now: int) -> None:
        node.policy_state = (self.age + 1, 1, now)

    def on_access(self, node: Node, now: int) -> None:
        freq = node.policy_state[1] + 1
        node.policy_state = (self.age + freq, freq, now)

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        if rank is None:
            return
        value = rank >> PACK_BITS
        if self.aging and value > self.age:
            self.age = value

    def priority(self, node: Node) -> int:
        value, _, last = node.policy_state
        return pack(value, last)
