"""Greedy-Dual-Size-Frequency: keep what is used often and costly to restore.

A node's value is ``L + frequency * restore_cost / size``, where the
evicted object is the tail page of a leaf (size one page) and
``restore_cost`` is the seconds to bring that page back: its prefill
recompute time at its depth (page ``i`` costs ``a + b*i``, attention grows
with position, :meth:`radixkv.costs.CostModel.page_recompute_seconds`), or
the cheaper transfer from a lower tier that holds a copy when a
``copies`` callback says so. ``L`` is the value of the last evicted leaf, so
values age as in LFU-DA. The lowest value goes first (ties: least recently
used). Source: Cherkasova, "Improving WWW proxies performance with
Greedy-Dual-Size-Frequency caching policy" (HP Labs, 1998); Cao & Irani,
GreedyDual-Size (1997).

Leaves are ranked by their *tail* page's cost, re-ranked as the tail moves
up, so deep (long-context) pages, which cost more to recompute, are kept
longer than shallow ones used as often.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Tuple

from radixkv.costs import DEFAULT_HARDWARE, DEFAULT_MODEL, CostModel, get_hardware, get_model
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.tree import Node

from .base import EvictionPolicy

if TYPE_CHECKING:  # pragma: no cover
    from radixkv.cache import PrefixCache


class GDSF(EvictionPolicy):
    """GDSF over pages. ``policy_state`` is ``(L at last use, frequency, last_use)``.

    Args:
        cost_model: restore costs; default: the cache's ``cost_model`` attribute if it
            has one, else llama-3-8b on an H100 at the cache's page size.
        copies: ``copies(node)`` -> names of lower tiers holding the node's pages
            (a spill layer supplies it); restore cost is then the cheaper of
            recompute and the fastest of those transfers.
    """

    name = "gdsf"
    aliases = ("cost",)

    def __init__(self, cost_model: Optional[CostModel] = None,
                 copies: Optional[Callable[[Node], Iterable[str]]] = None) -> None:
        if cost_model is not None and not isinstance(cost_model, CostModel):
            raise ArgumentTypeError(f"cost_model must be a radixkv.costs.CostModel, got {cost_model!r}")
        self.cost_model = cost_model
        self.copies = copies
        self.age = 0.0
        """``L``: the value of the last evicted leaf (monotonic)."""

    def attach(self, cache: "PrefixCache") -> None:
        if self.cost_model is None:
            self.cost_model = getattr(cache, "cost_model", None) or CostModel(
                get_model(DEFAULT_MODEL), get_hardware(DEFAULT_HARDWARE), cache.page_size)
        if self.cost_model.page_size != cache.page_size:
            raise ArgumentValueError(f"cost_model page_size {self.cost_model.page_size} differs from the "
                                     f"cache's page_size, got {cache.page_size!r}")

    def restore_seconds(self, node: Node, page_index: int) -> float:
        """Seconds to restore page ``page_index`` (depth from the root) of ``node``. O(copies)."""
        cost = self.cost_model.page_recompute_seconds(page_index)
        if self.copies is not None:
            for tier in self.copies(node):
                cost = min(cost, self.cost_model.page_transfer_seconds(tier))
        return cost

    def on_insert(self, node: Node, now: int) -> None:
        node.policy_state = (self.age, 1, now)

    def on_access(self, node: Node, now: int) -> None:
        node.policy_state = (self.age, node.policy_state[1] + 1, now)

    def on_evict(self, node: Node, pages: int, rank: Any) -> None:
        if rank is not None and rank[0] > self.age:
            self.age = rank[0]

    def priority(self, node: Node) -> Tuple[float, int]:
        age, freq, last = node.policy_state
        return (age + freq * self.restore_seconds(node, node.end - 1), last)
