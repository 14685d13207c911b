"""Transfer accounting: bytes moved per link and the simulated seconds they take.

Every copy between tiers goes through :class:`TransferLedger.record`, which
turns a ``(source tier, destination tier)`` pair into the links crossed and
charges ``latency + bytes / bandwidth`` on each (one call = one batched
transfer, so latency is paid once per batch, as a DMA or an RDMA read would).

A route is the symmetric difference of the two tiers' paths to HBM (HBM's own
path is empty): host -> HBM crosses ``pcie``; remote -> HBM crosses
``network`` and ``pcie`` (staged through host DRAM, not overlapped, as
:data:`radixkv.costs.DEFAULT_TIER_PATHS` assumes); host -> remote crosses
``network`` only. Defaults and their sources are in :mod:`radixkv.costs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Tuple

from ..costs import Link

HBM = "hbm"


@dataclass(frozen=True, slots=True)
class TransferTotals:
    """A snapshot of a :class:`TransferLedger`.

    Attributes:
        bytes_by_link: bytes moved over each link (``"pcie"``, ``"network"``, ...).
        seconds_by_link: simulated seconds spent on each link.
        bytes_by_route: bytes per ``"src->dst"`` tier pair (``"hbm->host"``, ``"host->hbm"``, ...).
        transfers: batched transfers recorded.
    """

    bytes_by_link: Dict[str, int] = field(default_factory=dict)
    seconds_by_link: Dict[str, float] = field(default_factory=dict)
    bytes_by_route: Dict[str, int] = field(default_factory=dict)
    transfers: int = 0

    @property
    def seconds(self) -> float:
        """Total simulated transfer time (links summed; no overlap assumed)."""
        return sum(self.seconds_by_link.values())


class TransferLedger:
    """Counts bytes and simulated time per link for copies between tiers.

    Args:
        links: link name -> :class:`~radixkv.costs.Link` (bandwidth, latency).
        tier_paths: tier name -> links crossed from that tier to HBM.

    Cost: :meth:`record` is O(links on the route).
    """

    __slots__ = ("links", "tier_paths", "_routes", "_bytes", "_seconds", "_route_bytes", "_transfers")

    def __init__(self, links: Mapping[str, Link], tier_paths: Mapping[str, Tuple[str, ...]]) -> None:
        self.links = dict(links)
        self.tier_paths = {HBM: (), **{t: tuple(p) for t, p in tier_paths.items()}}
        self._routes: Dict[Tuple[str, str], Tuple[str, ...]] = {}
        self._bytes: Dict[str, int] = {}
        self._seconds: Dict[str, float] = {}
        self._route_bytes: Dict[str, int] = {}
        self._transfers = 0

    def route(self, src: str, dst: str) -> Tuple[str, ...]:
        """Links crossed moving data from tier ``src`` to tier ``dst``."""
        key = (src, dst)
        links = self._routes.get(key)
        if links is None:
            a, b = self.tier_paths[src], self.tier_paths[dst]
            links = self._routes[key] = tuple(ln for ln in a if ln not in b) + tuple(ln for ln in b if ln not in a)
        return links

    def record(self, src: str, dst: str, num_bytes: int) -> float:
        """Charge one batched copy of ``num_bytes`` from ``src`` to ``dst``; return its seconds."""
        if num_bytes <= 0:
            return 0.0
        total = 0.0
        for name in self.route(src, dst):
            link = self.links[name]
            seconds = link.latency + num_bytes / link.bandwidth
            self._bytes[name] = self._bytes.get(name, 0) + num_bytes
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds
            total += seconds
        route = f"{src}->{dst}"
        self._route_bytes[route] = self._route_bytes.get(route, 0) + num_bytes
        self._transfers += 1
        return total

    def totals(self) -> TransferTotals:
        """A copy of the counters."""
        return TransferTotals(dict(self._bytes), dict(self._seconds), dict(self._route_bytes), self._transfers)

    def reset(self) -> None:
        self._bytes.clear()
        self._seconds.clear()
        self._route_bytes.clear()
        self._transfers = 0
