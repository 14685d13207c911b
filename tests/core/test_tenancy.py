"""Sharing between tenants (radixkv.tenancy through PrefixCache): what a tenant can observe.

The central property: under k-anonymous sharing, a page served to tenant X as a hit was
requested before by X itself or by at least k distinct other tenants, whatever sequence of
requests (admissions released or aborted, matches, held admissions, evictions) came before;
and a tenant facing fewer than k others observes exactly what it would observe alone.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, strategies as st

from radixkv import PrefixCache
from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.tenancy import Adaptive, KAnonymous, available, create

from ..strategies import snapshot

PAGE = 2
TENANTS = ["a", "b", "c", "d", None]

# A request is a path of 1..4 pages over a small alphabet, so requests share prefixes often.
paths = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple)
steps = st.lists(
    st.tuples(st.sampled_from(TENANTS), paths, st.sampled_from(["release", "abort", "hold", "match", "insert"])),
    max_size=30)


def tokens(path) -> list:
    """Page ``i`` of a path holds its letter twice, plus the depth, so equal prefixes are equal pages."""
    return [t for d, p in enumerate(path) for t in (p, 10 * d + p)]


def run(cache: PrefixCache, sequence, history=None, on_hit=None, holders=None) -> list:
    """Replay ``sequence`` on ``cache`` (check() after every step); return the tokens served per step.

    ``on_hit(tenant, path, served_pages)`` is called before the step enters ``history``. Each
    tenant holds at most two admissions open, released oldest first by its own next hold
    (``holders``: whose queue each step's hold joins, the tenant by default).
    """
    held = defaultdict(list)
    observed = []
    for step, (tenant, path, how) in enumerate(sequence):
        if how == "match":
            served = cache.match(tokens(path), tenant=tenant).num_tokens
        elif how == "insert":  # SGLang's way: match, compute the rest into own blocks, insert it all
            m = cache.match(tokens(path), tenant=tenant)
            served = m.num_tokens
            cache.lock(m.node)  # as SGLang: the matched pages stay while it allocates the rest
            own = cache.allocate(len(path) - len(m.blocks))
            if own is not None:
                cache.insert(tokens(path), np.concatenate([m.blocks, own]), tenant=tenant)
            cache.unlock(m.node)
        else:
            adm = cache.admit(tokens(path), tenant=tenant)
            served = adm.hit_tokens
            assert len(adm.blocks) <= len(path)
            if how == "release":
                adm.release()
            elif how == "abort":
                adm.abort()
            else:
                mine = held[tenant if holders is None else holders[step]]
                mine.append(adm)
                if len(mine) > 2:
                    mine.pop(0).release()
        observed.append(served)
        if on_hit is not None:
            on_hit(tenant, path, served // PAGE)
        if history is not None:
            for d in range(1, len(path) + 1):
                history[path[:d]].add(tenant)
        cache.check()
    for adm in [adm for mine in held.values() for adm in mine]:
        adm.release()
    cache.check()
    assert cache.num_held_blocks == 0, "blocks leaked"
    return observed


@given(sequence=steps, k=st.integers(1, 3), num_blocks=st.integers(2, 12), adaptive=st.booleans())
def test_k_anonymous_hit_needs_the_tenant_itself_or_k_others(sequence, k, num_blocks, adaptive):
    """Every served page: requested before by the tenant, or by >= k distinct others (evicting,
    aborting and holding on the way). Under adaptive, only ``budget`` requests per tenant break it."""
    rule = Adaptive(k=k, budget=1) if adaptive else KAnonymous(k=k)
    cache = PrefixCache(num_blocks, page_size=PAGE, sharing=rule)
    history = defaultdict(set)
    broken = defaultdict(int)

    def on_hit(tenant, path, served):
        for d in range(1, served + 1):
            who = history[path[:d]]
            if tenant not in who and len(who) < k:
                broken[tenant] += 1
                break

    run(cache, sequence, history, on_hit)
    assert all(n <= (1 if adaptive else 0) for n in broken.values()), dict(broken)


@given(attacker=steps, others=steps, k=st.integers(2, 4), data=st.data())
def test_fewer_than_k_others_are_invisible(attacker, others, k, data):
    """A tenant facing fewer than k other tenants observes exactly what it observes alone, in
    any interleaving of its requests with theirs, their aborts included (no eviction here:
    capacity holds everything; the game of test_indistinguishability plays full pools)."""
    crew = data.draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=k - 1, unique=True))
    mine = [("x", path, how) for _, path, how in attacker]
    theirs = [(crew[i % len(crew)], path, how) for i, (_, path, how) in enumerate(others)]
    order = data.draw(st.permutations([0] * len(mine) + [1] * len(theirs)))
    together, queues = [], [list(mine), list(theirs)]
    for who in order:
        together.append(queues[who].pop(0))
    capacity = 8 * (len(together) + 1)
    alone = run(PrefixCache(capacity, page_size=PAGE, sharing=KAnonymous(k=k)), mine)
    seen = run(PrefixCache(capacity, page_size=PAGE, sharing=KAnonymous(k=k)), together)
    assert [s for s, (tenant, _, _) in zip(seen, together) if tenant == "x"] == alone


@given(sequence=steps, num_blocks=st.integers(2, 12))
def test_isolated_shares_nothing(sequence, num_blocks):
    """Under isolated, a served page was requested before by the same tenant."""
    cache = PrefixCache(num_blocks, page_size=PAGE, sharing="isolated")
    history = defaultdict(set)

    def on_hit(tenant, path, served):
        for d in range(1, served + 1):
            assert tenant in history[path[:d]], (tenant, path[:d], history[path[:d]])

    run(cache, sequence, history, on_hit)


@given(sequence=steps, num_blocks=st.integers(2, 12))
def test_shared_is_the_cache_without_tenants(sequence, num_blocks):
    """Under shared (the default) tenants change nothing: the same hits and the same pages as a
    cache that never heard of them."""
    with_tenants = PrefixCache(num_blocks, page_size=PAGE, sharing="shared")
    without = PrefixCache(num_blocks, page_size=PAGE)
    seen = run(with_tenants, sequence)
    assert seen == run(without, [(None, path, how) for _, path, how in sequence],
                       holders=[tenant for tenant, _, _ in sequence])
    assert snapshot(with_tenants) == snapshot(without)


def test_each_tenant_keeps_its_own_copy_and_copies_are_written_bytes():
    """Under k-anonymity a tenant's pages are its own partition: a copy of another tenant's page
    is made only once k others asked for it, holds the bytes written for it, and is the
    tenant's own from then on (the source may go)."""
    cache = PrefixCache(16, page_size=PAGE, sharing=KAnonymous(k=2), kv_shape=(1,), dtype="float32")
    for n, tenant in enumerate(("a", "b")):
        adm = cache.admit(tokens((1, 2)), tenant=tenant)
        assert adm.hit_tokens == 0 and adm.copied_pages == 0  # fewer than 2 others asked
        cache.write(adm.new_blocks, np.full((2, PAGE, 1), 7.0))
        adm.release()
    assert cache.num_cached_blocks == 4 and sorted(map(str, cache.namespaces())) == ["(None, 'a')", "(None, 'b')"]
    adm = cache.admit(tokens((1, 2, 0)), tenant="c")
    assert adm.hit_tokens == 4 and adm.copied_pages == 2 and cache.copied_blocks == 2
    np.testing.assert_array_equal(cache.read(adm.blocks[:2]), np.full((2, PAGE, 1), 7.0))
    cache.write(adm.new_blocks, np.full((1, PAGE, 1), 3.0))
    adm.release()
    cache.check()
    for tenant in ("a", "b"):  # the sources may go: c's copy is its own
        with cache.admit(tokens((5, 5, 5, 5)), tenant=tenant):
            pass
    cache.evict(cache.evictable_blocks)
    cache.check()
    assert cache.cached_pages(tokens((1, 2)), namespace=None) == 0  # tenant-blind: the namespace partition


def served(cache: PrefixCache, path, tenant) -> int:
    """Hit tokens of one admission of ``path`` by ``tenant``, released."""
    with cache.admit(tokens(path), tenant=tenant) as adm:
        return adm.hit_tokens


def test_a_prefix_becomes_a_hit_for_all_after_k_others():
    cache = PrefixCache(32, page_size=PAGE, sharing=KAnonymous(k=2))
    for tenant in ("a", "b"):
        assert served(cache, (1, 2), tenant) == 0
    assert cache.admit(tokens((1, 2)), tenant="c").hit_tokens == 4  # a and b asked: a copy
    assert served(cache, (1, 2, 0), "c") == 4
    assert served(cache, (1, 2), "a") == 4  # its own
    assert cache.match(tokens((1, 2, 0)), tenant="d").num_tokens == 4  # page 3: c alone asked
    assert cache.match(tokens((1, 2, 0)), tenant="c").num_tokens == 6
    assert cache.sharing.askers(cache._copies.request_keys(
        np.asarray(tokens((1, 2)), dtype=np.uint32).tobytes(), 2, None)[1].item()) is None  # public: a, b, c


def test_adaptive_isolates_a_tenant_after_its_budget():
    rule = Adaptive(k=3, budget=2)
    cache = PrefixCache(64, page_size=PAGE, sharing=rule)
    for p in range(3):
        cache.admit(tokens((p, p)), tenant="victim").release()
    served = [cache.admit(tokens((p, p)), tenant="prober").hit_tokens for p in range(3)]
    assert served == [4, 4, 0] and rule.isolated_tenants() == ["prober"]
    cache.check()


def test_isolated_partitions_by_tenant_within_namespaces():
    cache = PrefixCache(32, page_size=PAGE, sharing="isolated")
    cache.admit(tokens((1,)), tenant="a", namespace="lora").release()
    assert cache.admit(tokens((1,)), tenant="a").hit_tokens == 0
    assert cache.admit(tokens((1,)), tenant="b", namespace="lora").hit_tokens == 0
    assert cache.admit(tokens((1,)), tenant="a", namespace="lora").hit_tokens == 2
    assert cache.admit(tokens((1,)), namespace="lora").hit_tokens == 0
    cache.check()


@pytest.mark.parametrize("tenant, error", [(3, ArgumentTypeError), (b"a", ArgumentTypeError),
                                           ("\ud800", ArgumentValueError)])
@pytest.mark.parametrize("sharing", available())
def test_a_bad_tenant_changes_nothing(sharing, tenant, error):
    cache = PrefixCache(16, page_size=PAGE, sharing=sharing)
    cache.admit(tokens((1, 2)), tenant="v").release()
    before = snapshot(cache)
    with pytest.raises(error, match="tenant"):
        cache.admit(tokens((1, 2)), tenant=tenant)
    with pytest.raises(error, match="tenant"):
        cache.match(tokens((1, 2)), tenant=tenant)
    own = cache.allocate(2)
    before = snapshot(cache)
    with pytest.raises(error, match="tenant"):
        cache.insert(tokens((3, 4)), own, tenant=tenant)
    assert snapshot(cache) == before
    cache.check()


def test_create_names_the_rules_and_options():
    assert create("k-anonymous", k=5).k == 5
    with pytest.raises(ArgumentValueError, match="k-anonymous"):
        create("k-anon")
    with pytest.raises(ArgumentValueError, match="'k'"):
        create("shared", k=2)
    with pytest.raises(ArgumentValueError, match="k"):
        create("k-anonymous", k=0)
    with pytest.raises(ArgumentTypeError, match="sharing"):
        create(3)


def test_adaptive_strike_counts_age_out_by_time_alone():
    """Every prober that ever was suspect used to keep a count forever; a count now goes once
    ``horizon`` releases passed since its tenant's last suspect request, whatever others do."""
    rule = Adaptive(k=3, budget=1, horizon=3)
    cache = PrefixCache(64, page_size=PAGE, sharing=rule)
    cache.admit(tokens((1, 1)), tenant="victim").release()
    for prober in ("p0", "p1"):
        assert cache.match(tokens((1, 1)), tenant=prober).num_tokens == 4  # its budget: one suspect hit
        cache.check()
    assert rule.isolated_tenants() == ["p0", "p1"]
    cache.admit(tokens((2, 2)), tenant="victim").release()
    assert cache.match(tokens((2, 2)), tenant="p1").num_tokens == 0  # spent its budget
    for n in range(3):  # three releases of others' own prompts: p0's and p1's counts age out
        cache.admit(tokens((3, n)), tenant="other").release()
    assert rule.isolated_tenants() == []
    assert cache.match(tokens((2, 2)), tenant="p1").num_tokens == 4  # a budget again
    assert "horizon=3" in repr(rule) and rule.fresh().horizon == 3
    with pytest.raises(ArgumentValueError, match="horizon"):
        Adaptive(horizon=0)

def _page_value(path, d: int) -> np.ndarray:
    """The KV of page ``d`` of ``path``: a function of the prefix through it (whoever computes it)."""
    return np.full((PAGE, 1), float(hash(tuple(path[: d + 1])) % 100003), dtype=np.float32)


@given(sequence=steps, k=st.integers(1, 2), num_blocks=st.integers(3, 10), adaptive=st.booleans(),
       tiered=st.booleans())
def test_every_hit_copied_or_own_holds_the_bytes_written_for_its_prefix(sequence, k, num_blocks, adaptive, tiered):
    """Copies are made of written pages only, and hold their source's bytes. A held admission's
    new pages hold a poison value until it is released (its KV is not written yet): a copy of
    them would carry it. Every hit is checked, copied pages included, except a tenant's own
    pages still pending (a batch mate of its own held admission)."""
    from radixkv.tiers import HostTier, TieredCache

    rule = Adaptive(k=k, budget=1) if adaptive else KAnonymous(k=k)
    if tiered:
        cache = TieredCache(num_blocks, page_size=PAGE, tiers=[HostTier(4)], sharing=rule, kv_shape=(1,),
                            dtype="float32", load_back="always")
    else:
        cache = PrefixCache(num_blocks, page_size=PAGE, sharing=rule, kv_shape=(1,), dtype="float32")
    held, pending = [], set()

    def verify(tenant, path, blocks):
        got = cache.read(blocks)
        for d in range(len(blocks)):
            if (tenant, path[: d + 1]) not in pending:
                np.testing.assert_array_equal(got[d], _page_value(path, d), err_msg=f"page {d} of {path} for {tenant}")

    def write(adm, path, hit, value=None):
        n = len(adm.new_blocks)
        if n:
            cache.write(adm.new_blocks, np.stack([_page_value(path, hit + j) if value is None else
                                                  np.full((PAGE, 1), value, dtype=np.float32) for j in range(n)]))

    for tenant, path, how in sequence:
        if how in ("match", "insert"):
            verify(tenant, path, cache.match(tokens(path), tenant=tenant).blocks)
            cache.check()
            continue
        adm = cache.admit(tokens(path), tenant=tenant)
        hit = adm.hit_tokens // PAGE
        verify(tenant, path, adm.blocks[:hit])
        if how == "hold":
            write(adm, path, hit, value=-1.0)
            mine = {(tenant, path[: hit + j + 1]) for j in range(len(adm.new_blocks))}
            pending |= mine
            held.append((adm, path, hit, tenant, mine))
        elif how == "release":
            write(adm, path, hit)
            adm.release()
        else:
            adm.abort()
        if len(held) > 2:
            adm, held_path, held_hit, _, mine = held.pop(0)
            write(adm, held_path, held_hit)
            pending -= mine
            adm.release()
        cache.check()
    for adm, *_ in held:
        adm.abort()
    cache.check()
