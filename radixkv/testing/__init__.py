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
Needs ``hypothesis`` (``pip install radixkv[test]``).
"""

from .machine import Target, conformance_settings, make_state_machine, run_conformance
from .protocol import EventContents, Match, PageKey, PrefixCacheUnderTest, RadixKVTarget
from . import strategies

__all__ = [
    "EventContents", "Match", "PageKey", "PrefixCacheUnderTest", "RadixKVTarget", "Target", "conformance_settings",
    "make_state_machine", "run_conformance", "strategies",
]
