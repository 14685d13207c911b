"""radixkv's KV events as SGLang 0.5.23's ``kv_events`` structs (only where SGLang is installed).

Layer: adapter events; reads :mod:`radixkv.events`, writes SGLang's structs.
"""

from __future__ import annotations

from typing import Any, List, Optional

from ...errors import ArgumentTypeError
from ... import events as _rk
from .mirrors import _sgl_events
from .namespaces import _cache_salt


def _int64(block_hash: int) -> int:
    """radixkv's unsigned 64-bit event hash as the signed int64 SGLang's events carry (same 64 bits)."""
    return block_hash - (1 << 64) if block_hash >= 1 << 63 else block_hash


class _SGLangEvents:
    """Turns radixkv's events into SGLang 0.5.23's ``kv_events`` structs, one for one.

    ``BlockStored`` keeps radixkv's hashes (as int64), parent hash, tokens (all
    pages of the event, concatenated) and ``block_size``; ``lora_id``,
    ``session_id`` and ``lora_name`` are ``None`` (radixkv keys adapters by
    namespace and has no LoRA name table); ``cache_salt`` is the salt of the
    page's namespace. radixkv names the namespace only on a sequence's first
    page (``extra_keys``), so this remembers the namespace of every salted
    cached page, by hash, until its ``BlockRemoved``: one dict entry per cached
    page of a salted namespace. Tier moves become their plain store/remove
    events. Cost: O(pages) per event.
    """

    __slots__ = ("_salt_of",)

    _MEDIUM = {_rk.MEDIUM_GPU: "GPU", _rk.MEDIUM_CPU: "CPU", _rk.MEDIUM_DISK: "DISK", _rk.MEDIUM_REMOTE: "EXTERNAL"}

    def __init__(self) -> None:
        self._salt_of: dict = {}  # radixkv hash of a cached page in a salted namespace -> its cache_salt

    def _medium(self, medium: Optional[str]) -> Any:
        name = self._MEDIUM.get(medium) if medium is not None else None
        return medium if name is None else _sgl_events.StorageMedium[name]

    def convert(self, events: List[_rk.KVCacheEvent]) -> list:
        out: list = []
        for event in events:
            if isinstance(event, (_rk.BlockDemoted, _rk.BlockPromoted)):
                out.extend(self._one(e) for e in event.as_store_remove())
            else:
                out.append(self._one(event))
        return out

    def _one(self, event: _rk.KVCacheEvent) -> Any:
        if isinstance(event, _rk.BlockStored):
            if event.extra_keys and event.extra_keys[0]:
                salt = _cache_salt(event.extra_keys[0][0])
            else:
                salt = self._salt_of.get(event.parent_block_hash)
            if salt is not None:
                self._salt_of.update(dict.fromkeys(event.block_hashes, salt))
            parent = event.parent_block_hash
            return _sgl_events.BlockStored(
                block_hashes=[_int64(h) for h in event.block_hashes],
                parent_block_hash=None if parent is None else _int64(parent),
                token_ids=list(event.token_ids), block_size=event.block_size, lora_id=event.lora_id,
                medium=self._medium(event.medium), cache_salt=salt, session_id=None, lora_name=event.lora_name)
        if isinstance(event, _rk.BlockRemoved):
            if self._salt_of:
                for h in event.block_hashes:
                    self._salt_of.pop(h, None)
            return _sgl_events.BlockRemoved(block_hashes=[_int64(h) for h in event.block_hashes],
                                            medium=self._medium(event.medium))
        if isinstance(event, _rk.AllBlocksCleared):
            self._salt_of.clear()
            return _sgl_events.AllBlocksCleared()
        raise ArgumentTypeError(f"no SGLang counterpart for radixkv event {event!r}")

