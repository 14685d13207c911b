"""Fixtures of the page-store tests: a fingerprint, fresh in-process stores, and real Redis servers.

The servers are :mod:`radixkv.testing.localredis`'s (free loopback ports, temporary directories);
like the Redis tier's tests (``tests/tiers/test_redis.py``, whose requirement check this reuses),
a missing redis-server or redis-py fails them under ``CI=true`` and skips them elsewhere.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import pytest

from radixkv.store import Fingerprint, drop_memory
from radixkv.testing.localredis import LocalRedis, LocalRedisCluster

from ..tiers.test_redis import _require_redis

FP = Fingerprint(model="llama-3-8b", dtype="float16", kv_shape=(2, 8, 128), page_size=4, tp_rank=0)
FINGERPRINTS = [FP] + [dataclasses.replace(FP, **change) for change in (
    {"model": "llama-3-70b"}, {"dtype": "bfloat16"}, {"kv_shape": (2, 8, 64)}, {"kv_shape": (8, 2, 128)},
    {"page_size": 8}, {"tp_rank": 1}, {"extra": "tp=2"})]
"""FP and fingerprints that differ from it in one field each."""
NAMESPACES = [None, "", "a", "b", ("a",), ("a", None), ("a", "t1"), ("a", "t2"), (("a", "t1"),), 1, b"a"]
"""Namespaces (partitions) that must never share a page."""
FINGERPRINTS_AND_NAMESPACES = [(fp, ns) for fp in FINGERPRINTS for ns in NAMESPACES]
_names = itertools.count()


@pytest.fixture
def memory_url():
    """A memory:// URL no other test uses; its pages are dropped afterwards."""
    name = f"test-{next(_names)}"
    yield f"memory://{name}"
    drop_memory(name)


@pytest.fixture
def redis_server():
    _require_redis()
    with LocalRedis() as server:
        yield server


@pytest.fixture
def cluster():
    _require_redis()
    with LocalRedisCluster(3) as c:
        yield c


@pytest.fixture(autouse=True)
def _quiet_first_backend_error():
    """Each store warns once at its first backend error; the tests count the errors instead
    (test_memory_store checks the warning itself)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="page store ", category=RuntimeWarning)
        yield
