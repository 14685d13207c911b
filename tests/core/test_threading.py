"""Threading model: a single-owner cache, copies on worker threads (radixkv.testing.workers).

The stress test runs loads (remote -> HBM) and stores (HBM -> remote) on four
copy threads that dawdle in the middle of every page, while the owner thread
keeps matching, allocating and evicting. It checks that no page is served
before its copy completed, and that every block is, at every step, exactly
one of free, cached or held by exactly one load in flight.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from functools import partial

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.pool import HELD
from radixkv.testing.workers import TransferWorker

PAGE = 4


def expected(namespace, prefix) -> np.ndarray:
    """The KV a page must hold: a digest of its namespace and full token prefix."""
    digest = hashlib.sha256(repr((namespace, tuple(prefix))).encode()).digest()
    return np.frombuffer(digest, dtype=np.uint8)[: PAGE * 4].astype(np.float32).reshape(PAGE, 4)


def slow_fetch(keys):
    """Worker: fill a staging buffer page by page, pausing mid-page so a premature read would see NaNs."""
    rng = random.Random(hash(tuple(keys)))
    staged = np.full((len(keys), PAGE, 4), np.nan, dtype=np.float32)
    for i, (namespace, prefix) in enumerate(keys):
        page = expected(namespace, prefix)
        staged[i, : PAGE // 2] = page[: PAGE // 2]
        time.sleep(rng.random() * 2e-4)
        staged[i, PAGE // 2 :] = page[PAGE // 2 :]
    return staged


def slow_read(data: np.ndarray, blocks: np.ndarray, keys):
    """Worker: DMA-like read of locked HBM pages, straight from the payload array, then verify them."""
    out = np.empty((len(blocks), PAGE, 4), dtype=np.float32)
    for i, block in enumerate(blocks.tolist()):
        out[i, : PAGE // 2] = data[block, : PAGE // 2]
        time.sleep(random.random() * 2e-4)
        out[i, PAGE // 2 :] = data[block, PAGE // 2 :]
    for page, key in zip(out, keys):
        if not np.array_equal(page, expected(*key)):
            raise AssertionError(f"page {key} changed under a store in flight")
    return out


def test_stress_concurrent_transfers_lose_and_duplicate_no_block():
    rng = random.Random(0)
    cache = PrefixCache(num_blocks=40, page_size=PAGE, kv_shape=(4,), dtype="float32")
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(0, 12))] for _ in range(4)]
    in_flight = set()          # blocks held by loads in flight
    remote = {}                # what stores wrote, applied on the owner thread
    served_pages = 0

    def keys_of(tokens, namespace, start, stop):
        return [(namespace, tuple(tokens[: (i + 1) * PAGE])) for i in range(start, stop)]

    with TransferWorker(num_threads=4) as worker:
        # Bounded by work done, not by time, so a slow or loaded machine runs the same test.
        for step in range(50_000):
            if worker.submitted >= 300:
                break
            tokens = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randrange(0, 14))]
            namespace = rng.choice([None, "t"])
            op = rng.random()
            if op < 0.55:  # a request: use what is cached now, load the rest in the background
                m = cache.match(tokens, namespace=namespace)
                hit = len(m.blocks)
                assert not in_flight.intersection(m.blocks.tolist()), "served a block still being loaded"
                for block, key in zip(m.blocks.tolist(), keys_of(tokens, namespace, 0, hit)):
                    assert np.array_equal(cache.read([block])[0], expected(*key)), f"page {key} served incomplete"
                    served_pages += 1
                need = len(tokens) // PAGE - hit
                if need <= 0:
                    continue
                cache.lock(m.node)
                blocks = cache.allocate(need)
                if blocks is None:  # everything else is locked by transfers in flight: wait for one
                    cache.unlock(m.node)
                    worker.poll(block=worker.in_flight > 0, timeout=5)
                    continue
                assert not in_flight.intersection(blocks.tolist()), "a block handed to two loads"
                in_flight.update(blocks.tolist())

                def loaded(staged, blocks=blocks, m=m, tokens=tokens, namespace=namespace):
                    assert np.isfinite(staged).all()
                    cache.write(blocks, staged)
                    n = (len(m.blocks) + len(blocks)) * PAGE
                    cache.insert(tokens[:n], np.concatenate([m.blocks, blocks]), namespace=namespace)
                    in_flight.difference_update(blocks.tolist())
                    cache.unlock(m.node)

                worker.submit(partial(slow_fetch, keys_of(tokens, namespace, hit, hit + need)), loaded)
            elif op < 0.7:  # a store: copy cached pages out while they stay locked
                m = cache.match(tokens, namespace=namespace)
                if not len(m.blocks):
                    continue
                cache.lock(m.node)
                keys = keys_of(tokens, namespace, 0, len(m.blocks))

                def stored(pages, m=m, keys=keys):
                    remote.update(zip(keys, pages))
                    cache.unlock(m.node)

                worker.submit(partial(slow_read, cache._pool.data, m.blocks.copy(), keys), stored)
            elif op < 0.85:
                cache.evict(rng.randrange(1, 8))
            else:
                worker.poll()
            if step % 25 == 0:
                cache.check()
                held = set(np.flatnonzero(cache._pool._state == HELD).tolist())
                assert held == in_flight, f"held blocks {sorted(held ^ in_flight)} not in flight, or lost"
        worker.drain(timeout=30)
        assert worker.applied == worker.submitted >= 300
    cache.check()
    assert cache.num_held_blocks == 0 and not in_flight
    assert cache.num_free_blocks + cache.num_cached_blocks == cache.num_blocks
    assert served_pages > 0 and remote
    for key, page in remote.items():
        assert np.array_equal(page, expected(*key))
    from radixkv.testing import RadixKVTarget
    for (namespace, prefix), block in RadixKVTarget(cache).contents().items():
        assert np.array_equal(cache.read([block])[0], expected(namespace, prefix))


def test_pages_loading_are_invisible_until_the_owner_applies_them():
    cache = PrefixCache(num_blocks=8, page_size=PAGE, kv_shape=(4,), dtype="float32")
    gate = threading.Event()
    blocks = cache.allocate(2)
    tokens = list(range(8))

    def fetch():
        gate.wait(5)
        return np.stack([expected(None, tokens[:4]), expected(None, tokens[:8])])

    with TransferWorker(num_threads=1) as worker:
        transfer = worker.submit(fetch, lambda staged: (cache.write(blocks, staged), cache.insert(tokens, blocks)))
        assert worker.poll() == 0 and not transfer.done
        assert cache.match(tokens).num_tokens == 0          # in flight: not served
        assert cache.evict(8) == 0 and cache.num_held_blocks == 2  # and not evictable
        gate.set()
        time.sleep(0.01)
        assert cache.match(tokens).num_tokens == 0          # copied, but not applied by the owner yet
        assert worker.drain(timeout=5) == 1 and transfer.done
        assert cache.match(tokens).num_tokens == 8
    cache.check()


def test_a_failed_copy_surfaces_on_the_owner_and_can_be_undone():
    cache = PrefixCache(num_blocks=4, page_size=PAGE)
    blocks = cache.allocate(2)

    def broken():
        raise OSError("remote host went away")

    with TransferWorker() as worker:
        worker.submit(broken, on_error=lambda exc: cache.free(blocks))
        worker.drain(timeout=5)
        assert cache.num_held_blocks == 0 and cache.num_free_blocks == 4
        worker.submit(broken)
        with pytest.raises(OSError, match="went away"):
            worker.drain(timeout=5)
        assert worker.in_flight == 0


def test_only_the_owner_thread_may_apply_completions():
    worker = TransferWorker()
    errors = []

    def intruder():
        for call in (lambda: worker.poll(), lambda: worker.submit(lambda: None)):
            try:
                call()
            except RuntimeError as exc:
                errors.append(str(exc))

    t = threading.Thread(target=intruder)
    t.start()
    t.join()
    worker.close()
    assert len(errors) == 2 and all("owner thread" in e for e in errors)
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit(lambda: None)
    with pytest.raises(TypeError):
        TransferWorker(num_threads="2")
