"""The SGLang adapter under a sharing rule: a request's cache_salt partitions, whatever the rule.

Driven by test_adapters_sglang's fake scheduler; the KV a slot holds is keyed by extra_key and
tokens only here, since a prefix's KV is the same whichever tenant computes it.
"""

from __future__ import annotations

import random

import pytest

from radixkv.adapters.sglang import MatchPrefixParams, RadixKey, RadixKVCache

from .test_adapters_sglang import FakeEngine


class TenantEngine(FakeEngine):
    def __init__(self, page_size: int, num_pages: int, sharing) -> None:
        super().__init__(page_size, num_pages)
        self.tree = RadixKVCache(self.pool, self.alloc, page_size, sharing=sharing)

    def _compute(self, req, *args, **kwargs) -> None:
        salt, req.cache_salt = req.cache_salt, None
        try:
            super()._compute(req, *args, **kwargs)
        finally:
            req.cache_salt = salt

    def _verify(self, req, *args) -> None:
        salt, req.cache_salt = req.cache_salt, None
        try:
            super()._verify(req, *args)
        finally:
            req.cache_salt = salt

    def run(self, prompt, salt, extra_key=None) -> int:
        req = self.start(prompt, extra_key, cache_salt=salt)
        self.finish(req)
        self.check()
        return req.hit


PROMPT = [5, 6, 7, 8, 9, 10, 11]


def test_a_salted_request_is_served_its_own_pages_under_k_anonymity():
    """Each salt's pages are its own partition; SGLang's allocator owns the free blocks, so no
    copy of another salt's pages is made here, however many salts asked."""
    from radixkv.tenancy import KAnonymous

    engine = TenantEngine(2, 32, KAnonymous(k=2))
    assert engine.run(PROMPT, "s1") == 0
    assert engine.run(PROMPT, "s2") == 0  # cached by s1 alone: a miss, recomputed in its own partition
    assert engine.run(PROMPT, "s1") == 6  # its own
    assert engine.run(PROMPT, "s3") == 0  # s1 and s2 asked, but no block to copy into
    assert engine.tree.total_size() == 18  # a copy per salt
    assert engine.run(PROMPT, "s4", extra_key="lora") == 0  # extra_key still partitions
    probe = MatchPrefixParams(key=RadixKey(PROMPT, cache_salt="s2"))
    assert engine.tree.match_prefix(probe).device_prefix_len == 6


@pytest.mark.parametrize("sharing", [None, "shared", "isolated"])
def test_without_a_filtering_rule_the_salt_partitions_as_in_sglang(sharing):
    engine = TenantEngine(2, 32, sharing)
    assert engine.run(PROMPT, "s1") == 0
    assert engine.run(PROMPT, "s2") == 0
    assert engine.run(PROMPT, "s1") == 6
    assert engine.tree.total_size() == 12


@pytest.mark.parametrize("seed", range(5))
def test_salted_traffic_loses_no_page_and_serves_no_wrong_kv(seed):
    """Random prompts, salts and chunking under k-anonymity with eviction: every served slot
    holds its prefix's KV (the fake checks it), no page is lost (check after every request)."""
    rng = random.Random(seed)
    engine = TenantEngine(2, 12, "k-anonymous")
    stems = [[rng.randrange(50) for _ in range(4)] for _ in range(3)]
    running = []
    for _ in range(40):
        prompt = rng.choice(stems) + [rng.randrange(50) for _ in range(rng.randrange(5))]
        try:
            req = engine.start(prompt, cache_salt=rng.choice(["a", "b", "c", "d", None]), chunk=rng.choice([0, 2]))
        except MemoryError:
            continue
        running.append(req)
        if len(running) > 1 or rng.random() < 0.5:
            engine.finish(running.pop(0))
        engine.check()
    for req in running:
        engine.finish(req)
    engine.check()
