"""Namespaces are validated before anything changes, at every entry point that takes one.

A namespace is ``None`` or a str with a UTF-8 encoding; a lone surrogate (which ``json.loads``
produces from an escaped half pair) is an ArgumentValueError and leaves the cache as it was.
Generated strings: any code point including surrogates, and JSON-looking text.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.errors import ArgumentValueError, RadixKVError
from radixkv.events.hashing import BlockHasher
from radixkv.tiers import HostTier, TieredCache

from ..strategies import snapshot

ANY_CHAR = st.characters(exclude_categories=())  # surrogates (Cs) included
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(ANY_CHAR, max_size=3),
                       lambda inner: st.lists(inner, max_size=3), max_leaves=4).map(json.dumps)
NAMESPACES = st.one_of(
    st.text(ANY_CHAR, max_size=4),
    JSONISH,
    JSONISH.map(lambda s: s.replace("\\\\", "\\")),  # escapes that json.loads turns into lone surrogates
    st.sampled_from(["\ud800", "a\udfff", "\ud83d\ude00", "\U0001f600", '["\\ud800"]', "", "None"]),
    st.text(ANY_CHAR, max_size=3).map(lambda s: json.loads(json.dumps(s))),
)


def encodable(namespace: str) -> bool:
    try:
        namespace.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def busy_cache(tiered: bool):
    """A cache with cached pages in two namespaces, an open admission and a pin; events on."""
    if tiered:
        cache = TieredCache(num_blocks=6, page_size=2, tiers=[HostTier(4)], write_policy="write_through",
                            enable_events=True)
    else:
        cache = PrefixCache(num_blocks=6, page_size=2, enable_events=True)
    cache.admit([1, 1, 2, 2]).release()
    cache.admit([1, 1, 3, 3], namespace="t").release()
    cache.pin([1, 1])
    open_admission = cache.admit([4, 4])
    return cache, open_admission


def calls(cache):
    held = cache.allocate(1)
    yield "admit", lambda ns: cache.admit([1, 1, 5, 5], namespace=ns).release()
    yield "admit_with_priority", lambda ns: cache.admit([1, 1, 5, 5], namespace=ns, priority=1).release()
    yield "match", lambda ns: cache.match([1, 1, 2, 2], namespace=ns)
    yield "insert", lambda ns: cache.insert([6, 6], held, namespace=ns)
    yield "pin", lambda ns: cache.pin([1, 1, 2, 2], namespace=ns)
    yield "unpin", lambda ns: cache.unpin([1, 1, 2, 2], namespace=ns)
    if hasattr(cache, "peek"):
        yield "peek", lambda ns: cache.peek([1, 1, 2, 2], namespace=ns)


@pytest.mark.parametrize("tiered", [False, True])
@settings(deadline=None)
@given(namespace=NAMESPACES)
def test_every_entry_point_refuses_an_unencodable_namespace_before_any_change(tiered, namespace):
    cache, adm = busy_cache(tiered)
    for name, call in calls(cache):
        before = snapshot(cache)
        pending = len(cache.event_log)
        try:
            call(namespace)
        except ArgumentValueError:
            assert not encodable(namespace), f"{name} refused a valid namespace {namespace!r}"
            assert snapshot(cache) == before, f"{name} changed the cache before refusing {namespace!r}"
            assert len(cache.event_log) == pending
        except RadixKVError:  # e.g. unpin of tokens never pinned there: a typed answer, nothing changed
            assert snapshot(cache) == before
        else:
            assert encodable(namespace), f"{name} accepted {namespace!r}, which has no UTF-8 form"
        cache.check()
    adm.release()
    cache.check()


@settings(deadline=None)
@given(namespace=NAMESPACES)
def test_hash_pages_refuses_the_namespaces_the_cache_refuses(namespace):
    for fn in ("sha256_cbor", "sha256"):
        hasher = BlockHasher(fn)
        if encodable(namespace):
            assert len(hasher.hash_pages([1, 2, 3, 4], 2, namespace=namespace)) == 2
        else:
            with pytest.raises(ArgumentValueError):
                hasher.hash_pages([1, 2, 3, 4], 2, namespace=namespace)


def test_lone_surrogate_with_events_leaves_nothing_locked():
    """The reported case: with events on, '\\ud800' raised UnicodeEncodeError after the leaf was
    linked and locked, and the free count later went negative."""
    cache = PrefixCache(num_blocks=4, page_size=2, enable_events=True)
    namespace = json.loads('"\\ud800"')
    with pytest.raises(ArgumentValueError):
        cache.admit([1, 2, 3, 4], namespace=namespace)
    cache.check()
    assert (cache.num_free_blocks, cache.protected_blocks, cache.num_held_blocks) == (4, 0, 0)
    assert cache.admit(np.arange(8), namespace="\U0001f600").hit_tokens == 0
    cache.check()
