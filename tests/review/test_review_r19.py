"""Defects found in review of k-anonymous sharing by copy (908dbb1), the cluster-wide page index
and settled pages (157351a, 33caf59) and the shared page store under the caches (1bd9755).

Each test states the behaviour radixkv documents; each failed on the code it was written against
(as a strict xfail) and passes since its fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.store import drop_memory
from radixkv.tenancy import KAnonymous
from radixkv.tiers.config import open_store

from .test_review_r17 import HookError, RaisingLRU


def _value(prefix) -> float:
    """The KV of the last page of ``prefix`` (page_size 1, kv_shape (1,)): a function of the whole prefix."""
    v = 0
    for t in prefix:
        v = (v * 7 + t + 1) % 1000003
    return float(v % 4093 + 1)


def _kv(tokens, start, n) -> np.ndarray:
    return np.array([_value(tokens[: d + 1]) for d in range(start, start + n)], dtype=np.float32).reshape(n, 1, 1)


def test_the_askers_bound_does_not_tell_the_attacker_whether_a_victim_sent_its_guess():
    """KAnonymous: 'one attacker tenant learns nothing from hits about prefixes fewer than k other
    tenants requested'; 'forgetting only refuses more'. But what is forgotten depends on the
    victim's prompt: the attacker asks for its guess [9] (a record), two honest tenants make [5]
    copyable. With the records bounded by count (2), a victim that sent [9] only added itself to
    the existing record, one that sent [8] added a record, which pushed out [5]'s: the attacker's
    next request for [5] was a copied hit in one world and a miss in the other. Records now age
    out by time alone (horizon releases after their page's last ask), in both worlds alike."""
    def world(secret):
        cache = PrefixCache(16, page_size=1, sharing=KAnonymous(k=2, horizon=2))
        cache.admit([5], tenant="h1").release()
        cache.admit([5], tenant="h2").release()  # [5]: two others asked, a copy for the attacker
        cache.admit([9], tenant="attacker").release()  # its guess
        cache.admit(secret, tenant="victim").release()
        cache.check()
        adm = cache.admit([5], tenant="attacker")
        return adm.hit_tokens, adm.copied_pages

    assert world([9]) == world([8])


def test_the_store_never_serves_pages_an_abort_uncached():
    """Admission.abort: the new pages 'leave the cache together with every page cached below them
    since (a batch mate that matched them computed its own KV over their unwritten bytes)', and
    'lower-tier copies of pages below them are forgotten'. The mate [1, 2, 3] matched the pending
    [1, 2] and released first: its page 3 went to the shared store at once. When [1, 2] is aborted,
    page 3 leaves HBM, but once another engine computes [1, 2] honestly, a third engine is served
    the mate's page 3 from the store: KV computed over the bytes [1, 2]'s blocks held unwritten."""
    name = "review-r19-store-abort"
    url = f"memory://{name}"

    def engine():
        return PrefixCache(8, page_size=1, kv_shape=(1,), dtype="float32",
                           store=open_store(url, 1, kv_shape=(1,), dtype="float32"))

    try:
        a = engine()
        first = a.admit([1, 2])  # KV not written yet
        mate = a.admit([1, 2, 3])  # matches the pending [1, 2]
        assert mate.hit_tokens == 2 and mate.num_new_pages == 1
        # the mate's KV is computed over what its prefix's blocks hold (unwritten: not [1, 2]'s KV)
        seen = a.read(mate.blocks[:2]).ravel()
        good = _kv([1, 2], 0, 2).ravel()
        a.write(mate.new_blocks, _kv([1, 2, 3], 2, 1) + float(np.abs(seen - good).sum()))
        mate.release()
        first.abort()
        a.check()
        assert a.match([1, 2, 3]).num_tokens == 0  # HBM: the mate's page left with the aborted ones
        b = engine()
        adm = b.admit([1, 2])
        b.write(adm.new_blocks, _kv([1, 2], 0, 2))
        adm.release()
        c = engine()
        adm = c.admit([1, 2, 3])
        served = adm.hit_tokens
        np.testing.assert_array_equal(c.read(adm.blocks[:served]), _kv([1, 2, 3], 0, served))
        adm.release()
    finally:
        drop_memory(name)


def test_an_abort_whose_priority_raises_serves_no_unwritten_page():
    """Admission.abort: 'the new pages are uncached, so no later request is served their unwritten
    bytes'; the engine's abort 'always completes' when a hook raises. With the policy's priority
    raising as the aborted leaf is unlocked, the pages stay cached, settled_pages counts them as
    written (a peer would pull them) and k-anonymous copies them to another tenant."""
    policy = RaisingLRU()
    cache = PrefixCache(8, page_size=1, policy=policy, kv_shape=(1,), dtype="float32", sharing=KAnonymous(k=1))
    adm = cache.admit([1, 2, 3], tenant="c")
    cache.write(adm.new_blocks, _kv([1, 2, 3], 0, 3))
    adm.release()  # c asked for [1, 2, 3]: a copy for every other tenant (k=1)
    assert cache.evict(3) == 3  # c's pages leave HBM
    adm = cache.admit([1, 2, 3], tenant="a")  # computed again; KV not written yet
    assert adm.num_new_pages == 3
    policy.fail = "priority"
    with pytest.raises(HookError):
        adm.abort()
    policy.fail = ""
    cache.check()
    assert cache.settled_pages([1, 2, 3], tenant="a") == 0, "aborted pages count as written"
    copy = cache.admit([1, 2, 3], tenant="b")
    served = copy.hit_tokens
    np.testing.assert_array_equal(cache.read(copy.blocks[:served]), _kv([1, 2, 3], 0, served))
    copy.release()
    cache.check()
