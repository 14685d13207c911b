"""radixkv for vLLM: a block-hash view of a cache, and the shared page store as a vLLM offload tier.

* :class:`VLLMBlockView` (:mod:`.blocks`): look a :class:`~radixkv.PrefixCache`'s
  pages up by vLLM's chained block hashes. No vLLM needed.
* :class:`RadixKVTier` (:mod:`.tier`): a ``SecondaryTierManager`` of vLLM
  0.33.0's ``TieringOffloadingSpec``, over :mod:`radixkv.store`; vLLM builds it
  from ``{"type": "RadixKVTier", "module_path": "radixkv.adapters.vllm", ...}``.
  It subclasses vLLM's class, so it is imported only when asked for
  (``radixkv.adapters.vllm.RadixKVTier``): importing this package never
  imports vLLM. Its engine-free half is :mod:`.store_tier`.
"""

from __future__ import annotations

from typing import Any

from ...errors import MissingExtraError
from .blocks import VLLMBlockView

__all__ = ["RadixKVTier", "VLLMBlockView"]


def __getattr__(name: str) -> Any:
    # PEP 562: RadixKVTier subclasses vLLM's SecondaryTierManager, so its module imports vLLM; load it on first use.
    if name == "RadixKVTier":
        try:
            from .tier import RadixKVTier
        except ImportError as exc:
            if getattr(exc, "name", None) and str(exc.name).split(".")[0] == "vllm":
                raise MissingExtraError("RadixKVTier needs vLLM 0.33.0: pip install 'radixkv[vllm]'") from exc
            raise
        return RadixKVTier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
