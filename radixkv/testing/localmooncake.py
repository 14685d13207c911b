"""Throwaway local Mooncake Stores for tests, benchmarks and demos of the Mooncake backend.

``LocalMooncakeMaster`` starts a ``mooncake_master`` (its HTTP metadata
server built in) and a ``mooncake_client`` storage node lending a segment on
free loopback ports, in a temporary directory of their own, and stops both on
exit; the master can be killed and restarted on the same ports while the
storage node lives on. It is :class:`radixkv.store.mooncake_backend.MooncakeMaster`
(``open_store("mooncake")`` starts one, and the library imports no fixture),
re-exported here under the fixture's name.
"""

from __future__ import annotations

from ..store.mooncake_backend import MooncakeMaster as LocalMooncakeMaster

__all__ = ["LocalMooncakeMaster"]
