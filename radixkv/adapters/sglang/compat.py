"""SGLang 0.5.5's calling conventions, kept for callers written against that release.

What differs from SGLang 0.5.5, which earlier versions of this adapter
followed: ``cache_finished_req`` / ``cache_unfinished_req`` are gone (SGLang
calls ``checkpoint`` and then frees the row itself); ``match_prefix``,
``insert`` and ``evict`` take parameter objects; ``MatchResult`` carries
``device_prefix_len`` (the indices are read with ``path_device_indices``) and
``best_match_node``; lock calls and ``evict`` return result objects, not ints;
requests keep their row state in ``req.kv`` (``req_pool_idx``,
``cache_protected_len``) and their lock in ``req.lock``. For existing callers,
``match_prefix(RadixKey)`` and ``insert(RadixKey, value)`` (the 0.5.5 calling
convention) still work and return :class:`LegacyMatchResult` / ``int``:
:class:`Calls055` answers them for :class:`~radixkv.adapters.sglang.RadixKVCache`.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class LegacyMatchResult(NamedTuple):
    """What ``match_prefix(RadixKey)`` returns: SGLang 0.5.5's ``MatchResult`` (same fields).

    Attributes:
        device_indices: token-slot indices of the matched prefix (int64).
        last_device_node: handle of the deepest matched node.
        last_host_node: same as ``last_device_node`` (no host tier behind this adapter).
        host_hit_length: always 0.
    """

    device_indices: Any
    last_device_node: Any
    last_host_node: Any
    host_hit_length: int = 0



class Calls055:
    """SGLang 0.5.5's ``match_prefix(RadixKey)`` and ``insert(RadixKey, value)``, mixed into the cache face.

    The face dispatches here when it is given a bare ``RadixKey`` rather than
    a parameter object; these use its conversions (``_match``, ``_out``,
    ``_slots``, ``_insert_slots``).
    """

    def _match_0_5_5(self, key: Any) -> LegacyMatchResult:
        """``match_prefix(RadixKey)``: the matched slots themselves (SGLang 0.5.5's ``MatchResult``)."""
        m = self._match(key)
        return LegacyMatchResult(self._out(self._slots(m.blocks)), m.node, m.node, 0)

    def _insert_0_5_5(self, key: Any, value: Any) -> int:
        """``insert(RadixKey, value)``: tokens already cached, as an int."""
        return self._insert_slots(key, value)[0]
