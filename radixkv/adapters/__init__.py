"""Engine-shaped faces of :class:`~radixkv.PrefixCache`.

* :mod:`radixkv.adapters.sglang`: :class:`~radixkv.adapters.sglang.RadixKVCache`,
  a drop-in for SGLang 0.5.23's ``RadixCache`` (its ``BasePrefixCache``
  interface), mapping SGLang's token-slot indices onto radixkv pages.
* :mod:`radixkv.adapters.vllm`: :class:`~radixkv.adapters.vllm.VLLMBlockView`,
  lookup of cached pages by vLLM-compatible chained block hashes; and
  ``RadixKVTier``, the shared page store as a secondary tier of vLLM 0.33.0's
  offloading connector (it subclasses vLLM's class: loaded on first use, and
  only where vLLM is installed).

The SGLang adapter and the block view work on duck-typed objects, so they are
usable (and tested) without SGLang or vLLM installed; where ``sglang`` is
importable, the SGLang adapter subclasses its ``BasePrefixCache`` and uses its types.
"""

from .sglang import RadixKey, RadixKVCache
from .vllm import VLLMBlockView

__all__ = ["RadixKey", "RadixKVCache", "VLLMBlockView"]
