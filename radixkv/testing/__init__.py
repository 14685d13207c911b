"""A conformance kit for prefix caches: the hypothesis state machine that tests radixkv.

Point it at any cache that implements :class:`PrefixCacheUnderTest` (match /
allocate / insert / lock / unlock / evict / check / contents) and it drives
random request sequences that share prefixes across namespaces, checks every
answer against a page-set model, and shrinks a failure to a minimal sequence
of calls::

    from radixkv.testing import run_conformance
    run_conformance(lambda: MyCache(num_blocks=8, page_size=2), max_examples=200)

or, as a pytest/unittest test class::

    TestMyCache = make_state_machine(lambda: MyCache(...)).TestCase

A :class:`Target` bundles a factory with the options its semantics need
(whole-node eviction, a hit cap, ...); :mod:`radixkv.testing.targets` ships
them for SGLang's ``RadixCache`` and ``UnifiedRadixCache`` and vLLM's
``BlockPool`` (imported only where those engines are installed).

radixkv's own :class:`~radixkv.PrefixCache` runs through :class:`RadixKVTarget`.
Needs ``hypothesis`` (``pip install radixkv[test]``), loaded on first use of the
machine or the strategies, so the fixtures beside the kit import without it:
:mod:`radixkv.testing.reference` (the independent LRU replay oracle),
:mod:`radixkv.testing.workers` (transfer worker threads) and
:mod:`radixkv.testing.localredis` (throwaway ``redis-server`` processes).
"""

import importlib
from typing import Any, List

from .protocol import EventContents, Match, PageKey, PrefixCacheUnderTest, RadixKVTarget

_HYPOTHESIS_PARTS = {"Target": "machine", "conformance_settings": "machine", "make_state_machine": "machine",
                     "run_conformance": "machine", "strategies": "strategies"}

__all__ = [
    "EventContents", "Match", "PageKey", "PrefixCacheUnderTest", "RadixKVTarget", "Target", "conformance_settings",
    "make_state_machine", "run_conformance", "strategies",
]


def __getattr__(name: str) -> Any:
    """Import the hypothesis-backed part that defines ``name`` on first access (PEP 562)."""
    module = _HYPOTHESIS_PARTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(f".{module}", __name__)
    value = loaded if name == module else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_HYPOTHESIS_PARTS))
