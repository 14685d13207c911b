"""radixkv's tier inside vLLM 0.33.0's real scheduler (``make test-vllm``).

Collected only where ``vllm`` is importable (the main suite does not install it: these
tests are not collected there rather than skipped). The Redis runs start their own
redis-server; a missing one fails them under ``CI=true`` and skips them elsewhere.
"""

from __future__ import annotations

import importlib.util
import itertools
import warnings

import pytest

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["test_*.py", "harness.py"]

_names = itertools.count()


@pytest.fixture
def memory_url():
    """A memory:// store no other test uses; dropped afterwards."""
    from radixkv.store import drop_memory

    name = f"vllm-tier-{next(_names)}"
    yield f"memory://{name}"
    drop_memory(name)


@pytest.fixture
def redis_url():
    """A redis:// URL of a throwaway loopback redis-server, stopped afterwards."""
    from radixkv.testing.localredis import LocalRedis

    from ..tiers.test_redis import _require_redis

    _require_redis()
    with LocalRedis() as server:
        yield f"redis://127.0.0.1:{server.port}"


@pytest.fixture(params=["memory", "redis"])
def store_url(request):
    """Each test twice: an in-process store, then a real redis-server on loopback."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(autouse=True)
def _quiet_store_warnings():
    """A store warns once at its first backend error; the fault tests cause them on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="page store ", category=RuntimeWarning)
        yield
