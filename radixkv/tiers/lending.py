"""Lending between instances: :class:`BorrowedTier`, a debtor's pages held in HBM blocks other instances lent.

The tier side of :mod:`radixkv.cluster`'s lending: slots are loans the
cluster's :class:`~radixkv.cluster.GlobalManager` records, recalls move a
page to another creditor or demote it, and a crashed creditor's pages are
forgotten with every copy below them. It reaches its stack only through the
stack's public methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..tree import Node
from .base import SLOT_DTYPE, Copy, Tier
from .stack import TierStack

if TYPE_CHECKING:
    from ..cluster import GlobalManager


def _copies_below(node: Node, tier: Optional[Tier] = None) -> List[Node]:
    """``node`` and the spill-tree copies below it (in ``tier`` only, if given), deepest first.

    Stops below a node that is not such a copy. Cost: O(subtree).
    """
    order: List[Node] = []
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n.ext, Copy) and (tier is None or n.ext.tier is tier):
            order.append(n)
            todo.extend((n.children or {}).values())
    order.reverse()  # parents came before their children: reversed, every child precedes its parent
    return order


class BorrowedTier(Tier):
    """Pages of one debtor held in blocks lent by other instances (slot = ``creditor * stride + block``).

    Capacity is whatever creditors agree to lend; a slot is borrowed when a
    page needs it and repaid when the page leaves, so the debt equals the
    pages held, always.
    """

    def __init__(self, manager: "GlobalManager", debtor: int) -> None:
        super().__init__("borrowed")
        self.manager = manager
        self.debtor = debtor
        self.where: Dict[int, Node] = {}
        """Slot -> spill-tree node holding it (for recalls)."""

    @property
    def capacity(self) -> int:
        return self.used + self.manager.lendable(self.debtor)

    def take(self, n: int) -> np.ndarray:
        slots = self.manager.borrow(self.debtor, n)
        self.used += len(slots)
        return slots

    def give(self, slots: np.ndarray) -> None:
        self.used -= len(slots)
        for s in slots.tolist():
            self.where.pop(s, None)
        self.manager.repay(self.debtor, slots)

    def write(self, slots: np.ndarray, pages: Optional[np.ndarray]) -> np.ndarray:
        if pages is not None:
            self.manager.write(slots, pages)
        return np.ones(len(slots), dtype=bool)

    def read(self, slots: np.ndarray):
        data = None if self.page_shape is None else self.manager.read(slots)
        return data, np.ones(len(slots), dtype=bool)

    def on_assign(self, node: Node) -> None:
        for s in node.ext.slots.tolist():
            self.where[s] = node

    def on_release(self, node: Node) -> None:
        for s in node.ext.slots.tolist():
            self.where.pop(s, None)

    def recall(self, slots: Sequence[int], creditor: int) -> Tuple[int, int]:
        """Vacate ``slots`` (held at ``creditor``): move each page to another creditor, else demote it.

        Returns ``(pages moved, pages demoted or dropped)``. The new block is
        reserved before the copy, so a failed move loses nothing. A page that
        cannot move is demoted with the rest of its node and every deeper
        borrowed page below it, deepest first (see :meth:`_demote_suffix`).
        """
        stack = self.stack
        index = stack.tiers.index(self)
        moved = demoted = 0
        for slot in slots:
            node = self.where.get(int(slot))
            if node is None:  # gone with an earlier page's suffix
                continue
            i = int(np.flatnonzero(node.ext.slots == slot)[0])
            value = self.manager.values[creditor].get(int(slot) - creditor * self.manager.stride)
            new = self.manager.borrow(self.debtor, 1, exclude=(creditor,), value=value)
            if len(new):
                if stack.has_payload:
                    self.manager.write(new, self.manager.read(np.array([slot], dtype=SLOT_DTYPE)))
                node.ext.slots[i] = new[0]
                del self.where[int(slot)]
                self.where[int(new[0])] = node
                self.manager.repay(self.debtor, np.array([slot], dtype=SLOT_DTYPE))
                moved += 1
            else:
                if i:
                    stack.split_copy(node, i)
                demoted += self._demote_suffix(stack, index, node)
        return moved, demoted

    def _demote_suffix(self, stack: TierStack, index: int, node: Node) -> int:
        """Demote ``node`` and every borrowed copy below it, deepest first; return the pages.

        A lookup reaches a copy only through the pages above it, so the pages
        below ``node`` that are lent too (at any creditor) cannot stay when
        ``node`` may be dropped. Demoting them first is the order the tier's own
        eviction keeps (a node leaves its tier after its descendants there), so
        each lands in the next tier above its own children, or is dropped as a
        leaf: nothing is stranded. Pages in later tiers stay. Cost: O(subtree).
        """
        pages = 0
        for n in _copies_below(node, self):
            pages += n.num_pages
            stack.demote(index, n)
        return pages

    def forget(self, creditor: int) -> int:
        """Forget the pages held in blocks ``creditor`` lent (its memory is gone); return pages forgotten.

        Each such page goes with the rest of its node and every copy below it,
        in any tier (unreachable without it), counted as lost; the blocks are
        repaid, so the ledger no longer shows them. Cost: O(slots held + subtrees).
        """
        stack = self.stack
        lo = creditor * self.manager.stride
        pages = 0
        try:
            with stack.completing():  # a tier policy that raises: every lent page still goes, then the error
                for slot in sorted(s for s in self.where if lo <= s < lo + self.manager.stride):
                    node = self.where.get(slot)
                    if node is None:  # gone with an earlier page's subtree
                        continue
                    i = int(np.flatnonzero(node.ext.slots == slot)[0])
                    if i:
                        stack.split_copy(node, i)
                    for n in _copies_below(node):
                        pages += n.num_pages
                        stack.forget_copy(n)
        finally:
            stack.lost_pages += pages
        return pages

    def check(self) -> None:
        """The ledger's row equals the pages held; every slot is a loan to this debtor held by its node. O(pages)."""
        owed = int(self.manager.debt[self.debtor].sum())
        assert owed == self.used, f"borrowed tier of {self.debtor} holds {self.used} pages, ledger says {owed}"
        assert len(self.where) == self.used, f"borrowed tier of {self.debtor}: slot index has {len(self.where)}"
        stride, loans = self.manager.stride, self.manager.loans
        for slot, node in self.where.items():
            assert node.alive and isinstance(node.ext, Copy) and node.ext.tier is self and slot in node.ext.slots, (
                f"borrowed tier of {self.debtor}: slot {slot} indexed to {node}, which does not hold it")
            assert loans[slot // stride].get(slot % stride) == self.debtor, (
                f"borrowed tier of {self.debtor}: slot {slot} is no loan to it")
