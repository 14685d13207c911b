"""Randomized faults under vLLM's real scheduler: a store that is down, a torn value, a page evicted between
lookup and load. The claim: no row is ever promoted with wrong bytes, every request still finishes (the pages
a load did not deliver are recomputed), and a failed page is remembered as a miss.

Each run: engine 1 computes a fresh prompt and stores its pages; engine 2 serves the same prompt while one
fault is injected at a random step boundary (before its lookups, between lookup and load, or after), into a
random page. Engine 2's fake worker checks every row it loads (:class:`.harness.Engine`).
"""

from __future__ import annotations

import os
import random
import time

import pytest
from vllm.distributed.kv_events import MEDIUM_STORAGE, BlockRemoved

from radixkv.testing.localredis import LocalRedis

from ..tiers.test_redis import _require_redis
from .harness import BLOCK_SIZE, Engine, make_request, offload_keys, tier_config, wait_io

FAULTS = ("down", "torn", "evicted")
RUNS = int(os.environ.get("RADIXKV_FAULT_RUNS", "1000"))


def torn(value: bytes, rng: random.Random) -> bytes:
    """``value`` damaged the ways a store tears a value: cut short, a flipped byte, or padded."""
    how = rng.randrange(3)
    if how == 0:
        return value[: rng.randrange(len(value))]
    if how == 1:
        i = rng.randrange(len(value))
        return value[:i] + bytes([value[i] ^ (1 << rng.randrange(8))]) + value[i + 1:]
    return value + b"\0" * rng.randrange(1, 64)


class Faults:
    """Injects one fault into a store, and undoes an outage."""

    def __init__(self, engine: Engine, rng: random.Random, server=None) -> None:
        self.core = engine.tier.core
        self.backend = self.core.store.backend
        self.rng = rng
        self.server = server

    def inject(self, kind: str, key: bytes) -> None:
        skey = self.core.store_key(key)
        if kind == "down":
            if self.server is None:
                self.backend.available = False
            else:
                self.server.kill()
        elif kind == "evicted":
            self.backend.delete([skey])
        else:
            value = self.backend.get([skey]).values[0]
            if not isinstance(value, bytes):  # not stored (a store that was down when engine 1 wrote)
                return
            self.backend.delete([skey])
            assert self.backend.set_nx([skey], [torn(value, self.rng)]).values == [True]

    def heal(self) -> None:
        if self.server is None:
            self.backend.available = True
        elif not self.server.running:
            self.server.restart()
            time.sleep(0.6)  # the backend skips a failed server for up to 0.5 s (Cooloff) before trying it again


def run_faults(url: str, runs: int, seed: int, server=None):
    rng = random.Random(seed)
    one = Engine("fault-one", tier_config(url, "m"))
    two = Engine("fault-two", tier_config(url, "m", answer_ttl=0.05), enable_events=True)
    faults = Faults(two, rng, server)
    failed_runs = promoted = 0
    try:
        for run in range(runs):
            text = [rng.randrange(32000) for _ in range(rng.randrange(2, 9) * BLOCK_SIZE + rng.randrange(1, 16))]
            first = make_request(text)
            one.serve([first], settle=wait_io)
            wait_io(one)
            keys = offload_keys(first)
            kind, page, at = rng.choice(FAULTS), rng.randrange(len(keys)), rng.randrange(4)
            before = two.tier.stats()
            loaded_before = two.loaded_blocks
            request = make_request(text)
            two.add(request)
            for step in range(200):
                if step == at:
                    faults.inject(kind, keys[page])
                if not two.scheduler.has_requests() and not two.connector.has_pending_push_work():
                    break
                two.step()
                wait_io(two)
            else:
                raise AssertionError(f"run {run}: engine 2 did not finish ({kind} at step {at})")
            faults.heal()
            after = two.tier.stats()
            assert request.is_finished(), (run, kind)
            assert two.wrong_loads == 0, (run, kind, page, at)
            failed_runs += after["load_failed_pages"] > before["load_failed_pages"]
            promoted += two.loaded_blocks - loaded_before
            # what engine 2 computed is exactly what it did not load: every prompt token is accounted for
            assert two.scheduler.get_num_unfinished_requests() == 0
    finally:
        faults.heal()
        one.shutdown()
        two.shutdown()
    return failed_runs, promoted, two


def test_randomized_faults_never_promote_wrong_bytes(memory_url):
    failed_runs, promoted, two = run_faults(memory_url, RUNS, seed=31)
    assert two.wrong_loads == 0
    # a page a load found gone is published as removed from the STORAGE tier
    removed = [e for e in two.published if isinstance(e, BlockRemoved) and e.medium == MEDIUM_STORAGE]
    assert len(removed) >= failed_runs // 2, (len(removed), failed_runs)
    # the faults bit: loads failed in many runs, and the runs still promoted most pages
    assert failed_runs >= RUNS // 10, failed_runs
    assert promoted >= RUNS, promoted
    stats = two.tier.stats()
    assert stats["store"]["integrity_misses"] > 0 and stats["load_failed_pages"] >= failed_runs


def test_randomized_faults_on_a_real_redis_server():
    _require_redis()
    with LocalRedis() as server:
        failed_runs, promoted, two = run_faults(f"redis://127.0.0.1:{server.port}", max(RUNS // 20, 20),
                                                seed=32, server=server)
    assert two.wrong_loads == 0 and failed_runs > 0 and promoted > 0
