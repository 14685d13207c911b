"""First in, first out: evict the leaf whose pages were cached earliest.

Priority is the logical time the node's pages were inserted; later uses do
not move it (a split copies it to the upper part, which was cached at the
same time). Ties go deepest page first. The classic baseline (Belady, 1966;
SGLang's ``fifo`` eviction strategy).
"""

from __future__ import annotations

from radixkv.tree import Node

from .base import EvictionPolicy


class FIFO(EvictionPolicy):
    """First in, first out (insertion time in ``policy_state``; accesses ignored)."""

    name = "fifo"

    def on_access(self, node: Node, now: int) -> None:
        pass

    def priority(self, node: Node) -> int:
        return node.policy_state
