"""Micro-benchmarks (pytest-benchmark): match / insert / admit / evict at 10^2 .. 10^6 cached blocks,
and replay throughput on both Mooncake traces.

    .venv/bin/python -m pytest bench/perf/test_micro.py --benchmark-only \
        --benchmark-json out/micro-raw.json
    .venv/bin/python bench/perf/micro_summary.py out/micro-raw.json bench/results/micro

Each size gets one cache, built once (module scope) by admitting random
requests that extend random earlier prompts (80%) or start fresh (20%), until
the pool of ``size`` blocks is full: a branching tree, as a prefix cache under
real traffic holds. Prompts are at most 128 pages at every size, so a larger
cache holds more prompts, not longer ones: the figures across sizes show what
the size of the cache costs each call. The operations then run at steady state on a full cache:

* ``match``: the longest cached prefix of a wholly cached prompt (a full hit),
  256 prompts taken at the same length quantiles at every size;
  ``extra_info`` holds the mean pages matched and nodes crossed.
* ``insert``: ``allocate`` + ``insert`` of a prompt's uncached pages (32 new
  ones below a cached prefix), their blocks freed beforehand and the prefix
  locked (untimed), so no eviction is timed.
* ``admit``: match + protect + evict (32 pages or more) + insert + release.
* ``evict``: ``evict(32)`` after an untimed admit that filled the pool.

Replay throughput: ``replay`` of the whole trace, pre-read into memory,
through LRU at 3M tokens (187,488 blocks of page 16), with and without
miss reasons; ``extra_info`` holds requests/s and prompt tokens/s.

``RADIXKV_BENCH_PAGE=1`` runs everything at another page size (default 16;
prompt lengths are in pages, so at page 1 the prompts hold 16x fewer tokens).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.workload.traces import TraceReader

PAGE = int(os.environ.get("RADIXKV_BENCH_PAGE", "16"))
REPLAY_BLOCKS = 187488 * 16 // PAGE  # 3M tokens
NEW_PAGES = 32
MAX_PROMPT_PAGES = 128
SIZES = [10**2, 10**3, 10**4, 10**5, 10**6]
TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


class Workload:
    """A full cache of ``size`` blocks and a sample of the prompts that filled it."""

    def __init__(self, size: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.cache = PrefixCache(size, PAGE)
        self.prompts: list = []  # reservoir of up to 4096 prompts admitted while filling
        seen = 0
        while self.cache.num_cached_blocks < size:
            tokens = self.new_prompt(int(rng.integers(1, min(64, size // 4) + 1)))
            self.cache.admit(tokens).release()
            seen += 1
            if len(self.prompts) < 4096:
                self.prompts.append(tokens)
            else:
                j = int(rng.integers(0, seen))
                if j < 4096:
                    self.prompts[j] = tokens

    def new_prompt(self, new_pages: int) -> np.ndarray:
        """A random cached prefix (a fresh start 20% of the time) plus ``new_pages`` random pages."""
        rng = self.rng
        fresh = rng.integers(0, 2**31, size=new_pages * PAGE, dtype=np.uint32)
        if not self.prompts or rng.random() < 0.2:
            return fresh
        base = self.prompts[int(rng.integers(len(self.prompts)))]
        # Prompts are at most MAX_PROMPT_PAGES long at every size (and fit with room to spare in
        # small caches), so the sizes differ in how much is cached, not in the work per call.
        room = max(0, min(MAX_PROMPT_PAGES, self.cache.num_blocks // 2) - new_pages)
        cut = int(rng.integers(0, min(len(base) // PAGE, room) + 1)) * PAGE
        return np.concatenate([base[:cut], fresh])


@pytest.fixture(scope="module", params=SIZES, ids=[f"{s:.0e}" for s in SIZES])
def workload(request):
    return Workload(request.param)


def path_shape(cache: PrefixCache, tokens: np.ndarray) -> tuple:
    """``(pages cached, nodes crossed)`` for ``tokens``: a read-only walk, so nothing changes."""
    tree = cache._tree
    node, pages, child, common = tree.walk(tree.root(None), tokens.tobytes(), len(tokens) // PAGE)
    nodes = 1 if child is not None else 0
    while node.parent is not None:
        node, nodes = node.parent, nodes + 1
    return pages + common, nodes


def full_hits(workload: Workload, count: int = 256) -> list:
    """``count`` prompts wholly cached now, spread evenly over their length distribution.

    Only prompts of the reservoir that are still wholly cached qualify (an
    earlier benchmark may have evicted some), so every call is a full hit.
    They are taken at evenly spaced length quantiles and shuffled, so every
    size matches prompts of the same lengths (no draw-to-draw noise) in no
    particular order.
    """
    cached = sorted((p for p in workload.prompts if path_shape(workload.cache, p)[0] == len(p) // PAGE), key=len)
    picks = [cached[(2 * i + 1) * len(cached) // (2 * count)] for i in range(count)]
    workload.rng.shuffle(picks)
    return picks


def test_match(benchmark, workload):
    cache = workload.cache
    prompts = full_hits(workload)
    shapes = np.array([path_shape(cache, p) for p in prompts])
    it = iter(range(10**12))

    def match():
        return cache.match(prompts[next(it) % 256])

    result = benchmark(match)
    assert result.num_tokens > 0
    assert all(path_shape(cache, p)[0] == len(p) // PAGE for p in prompts)  # still full hits
    benchmark.extra_info.update(cached_blocks=cache.num_cached_blocks, page_size=PAGE, pages_matched=round(shapes[:, 0].mean(), 1),
                                nodes_crossed=round(shapes[:, 1].mean(), 1))


def test_insert(benchmark, workload):
    cache = workload.cache
    held = []  # the matched prefix stays locked from setup until the next setup

    def setup():
        while held:
            cache.unlock(held.pop())
        tokens = workload.new_prompt(NEW_PAGES)
        m = cache.match(tokens)
        cache.lock(m.node)
        held.append(m.node)
        need = len(tokens) // PAGE - m.num_tokens // PAGE
        cache.evict(max(0, need - cache.num_free_blocks))
        return (tokens, m.blocks, need), {}

    def insert(tokens, matched, need):
        cache.insert(tokens, np.concatenate([matched, cache.allocate(need)]))

    benchmark.pedantic(insert, setup=setup, rounds=300, iterations=1, warmup_rounds=5)
    while held:
        cache.unlock(held.pop())
    cache.check()
    benchmark.extra_info.update(cached_blocks=cache.num_cached_blocks, page_size=PAGE)


def test_admit(benchmark, workload):
    cache = workload.cache

    def setup():
        return (workload.new_prompt(NEW_PAGES),), {}

    def admit(tokens):
        cache.admit(tokens).release()

    benchmark.pedantic(admit, setup=setup, rounds=300, iterations=1, warmup_rounds=5)
    assert cache.num_cached_blocks == cache.num_blocks
    benchmark.extra_info.update(cached_blocks=cache.num_cached_blocks, page_size=PAGE)


def test_evict(benchmark, workload):
    cache = workload.cache

    def setup():
        cache.admit(workload.new_prompt(NEW_PAGES)).release()  # refill what the last round evicted
        return (), {}

    benchmark.pedantic(lambda: cache.evict(NEW_PAGES), setup=setup, rounds=300, iterations=1, warmup_rounds=5)
    cache.admit(workload.new_prompt(NEW_PAGES)).release()
    benchmark.extra_info.update(cached_blocks=cache.num_cached_blocks, page_size=PAGE)


@pytest.fixture(scope="module", params=["mooncake_conversation", "mooncake_synthetic"])
def trace_requests(request):
    return request.param, list(TraceReader(str(TRACES / f"{request.param}.jsonl")))


@pytest.mark.parametrize("miss_reasons", [True, False], ids=["reasons", "no-reasons"])
def test_replay_throughput(benchmark, trace_requests, miss_reasons):
    name, requests = trace_requests
    result = benchmark.pedantic(lambda: replay(requests, PrefixCache(REPLAY_BLOCKS, PAGE), miss_reasons=miss_reasons),
                                rounds=3, iterations=1, warmup_rounds=0)
    seconds = benchmark.stats.stats.min
    benchmark.extra_info.update(trace=name, requests=result.requests, prompt_tokens=result.prompt_tokens,
                                token_hit_rate=round(result.token_hit_rate, 6),
                                requests_per_second=round(result.requests / seconds),
                                prompt_tokens_per_second=round(result.prompt_tokens / seconds))
