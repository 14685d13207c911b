"""StoreTierCore, the engine-free half of the vLLM tier: namespaced keys, asynchronous lookups, verified loads.

No vLLM needed (its scheduler-driven tests are tests/vllm, ``make test-vllm``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from radixkv.adapters.vllm.store_tier import HIT, MISS, RETRY, StoreTierCore
from radixkv.errors import ArgumentTypeError, ArgumentValueError, MissingExtraError
from radixkv.store import Fingerprint, PageStore, drop_memory

ROW = 256
FP = Fingerprint(model="m", dtype="float16", kv_shape=(ROW,), page_size=16)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def url():
    yield "memory://store-tier-core"
    drop_memory("store-tier-core")


def core(url, namespace="m", rows=8, fingerprint=FP, **kw):
    primary = np.zeros((rows, ROW), dtype=np.uint8)
    return StoreTierCore(PageStore.open(url, fingerprint), namespace, primary, **kw)


def keys(n, tag=b"k"):
    return [tag + bytes([i]) * 31 + b"\0\0\0\0" for i in range(n)]


def settle(c):
    c.flush_lookups()
    assert c.drain(timeout=5)


def write_rows(c, n, seed=0):
    c.primary[:n] = np.random.default_rng(seed).integers(0, 256, size=(n, ROW), dtype=np.uint8)
    return c.primary[:n].copy()


def test_keys_are_namespaced_and_fingerprinted(url):
    k = keys(1)[0]
    a, b = core(url, "model-a"), core(url, "model-b")
    other_fp = core(url, "model-a", fingerprint=Fingerprint(model="m", dtype="bfloat16", kv_shape=(ROW,), page_size=16))
    assert a.store_key(k) == core(url, "model-a").store_key(k)
    assert len({a.store_key(k), b.store_key(k), other_fp.store_key(k)}) == 3
    assert a.store_key(k) != a.store_key(keys(1, b"j")[0])
    with pytest.raises(ArgumentTypeError):
        a.store_key("not bytes")


def test_lookup_retries_then_answers_the_leading_run(url):
    clock = Clock()
    writer, reader = core(url), core(url, answer_ttl=1.0, clock=clock)
    ks = keys(4)
    rows = write_rows(writer, 3)
    writer.submit_store(1, ks[:3], [0, 1, 2])
    assert writer.drain(5)
    assert [j.success for j in writer.finished_jobs()] == [True]
    assert [reader.lookup(k, "r") for k in ks] == [RETRY] * 4
    assert reader.busy
    settle(reader)
    assert [reader.lookup(k, "r") for k in ks] == [HIT, HIT, HIT, MISS]
    clock.now = 2.0  # the answers aged out: asked again
    assert reader.lookup(ks[0], "r") == RETRY
    reader.submit_load(7, ks[:3], [5, 6, 7])
    assert reader.drain(5)
    (job,) = reader.finished_jobs()
    assert job.job_id == 7 and job.is_load and job.success and job.num_bytes == 3 * ROW
    assert np.array_equal(reader.primary[5:8], rows)


def test_a_torn_vanished_or_unreachable_page_is_not_loaded_and_is_a_miss(url):
    writer = core(url)
    ks = keys(4)
    rows = write_rows(writer, 4)
    writer.submit_store(1, ks, [0, 1, 2, 3])
    assert writer.drain(5)
    backend = writer.store.backend
    skey = writer.store_key(ks[1])
    value = backend.get([skey]).values[0]
    backend.delete([skey])
    backend.set_nx([skey], [value[:-1] + bytes([value[-1] ^ 1])])  # one flipped bit

    reader = core(url)
    reader.primary[:] = 7
    reader.submit_load(2, ks, [4, 5, 6, 7])
    assert reader.drain(5)
    (job,) = reader.finished_jobs()
    assert not job.success and job.successful_keys == (ks[0],) and job.num_bytes == ROW
    assert job.stored_keys == (ks[1],)  # the page found gone: a removal event
    assert np.array_equal(reader.primary[4], rows[0])
    assert (reader.primary[5:] == 7).all()  # no row written from a refused page or past it
    assert reader.lookup(ks[1], "r") == MISS  # remembered: no retry storm
    assert reader.lookup(ks[0], "r") == HIT
    assert reader.lookup(ks[2], "r") == RETRY  # past the failure: asked again when looked up
    assert reader.stats()["store"]["integrity_misses"] == 1

    backend.delete([writer.store_key(ks[0])])  # vanished after a HIT
    reader.submit_load(3, ks[:1], [4])
    assert reader.drain(5)
    (job,) = reader.finished_jobs()
    assert not job.success and job.successful_keys is None and job.num_bytes == 0

    backend.available = False  # the store is down: loads and stores fail, nothing raises
    try:
        with pytest.warns(RuntimeWarning, match="page store"):
            reader.submit_load(4, ks[2:], [6, 7])
            reader.submit_store(5, keys(2, b"z"), [0, 1])
            assert reader.drain(5)
        jobs = {j.job_id: j for j in reader.finished_jobs()}
        assert not jobs[4].success and not jobs[5].success and (reader.primary[6:] == 7).all()
        assert reader.stats()["store_failed_pages"] == 2
    finally:
        backend.available = True


def test_a_page_of_another_row_size_is_refused(url):
    small = StoreTierCore(PageStore.open(url, FP), "m", np.ones((2, ROW // 2), dtype=np.uint8))
    small.submit_store(1, keys(1), [0])
    assert small.drain(5)
    reader = core(url)
    reader.submit_load(2, keys(1), [0])
    assert reader.drain(5)
    (job,) = reader.finished_jobs()
    assert not job.success and (reader.primary[0] == 0).all()


def test_bad_arguments_raise_typed_errors(url):
    c = core(url)
    with pytest.raises(ArgumentValueError):
        c.submit_store(1, keys(2), [0])
    with pytest.raises(ArgumentValueError):
        c.submit_load(1, keys(1), [99])
    with pytest.raises(ArgumentValueError):
        core(url, namespace="")
    with pytest.raises(ArgumentTypeError):
        StoreTierCore(PageStore.open(url, FP), "m", np.zeros((2, ROW), dtype=np.float32))
    with pytest.raises(ArgumentTypeError):
        StoreTierCore("memory://x", "m", np.zeros((2, ROW), dtype=np.uint8))
    c.close()
    with pytest.raises(ArgumentValueError):
        c.submit_store(1, keys(1), [0])


def test_import_radixkv_never_imports_vllm():
    code = ("import sys, radixkv, radixkv.adapters, radixkv.adapters.vllm, radixkv.adapters.vllm.store_tier; "
            "assert 'vllm' not in sys.modules, 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_tier_without_vllm_names_the_extra():
    import radixkv.adapters.vllm as adapter

    with pytest.raises(MissingExtraError, match=r"radixkv\[vllm\]"):
        adapter.RadixKVTier
