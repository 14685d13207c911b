"""radixkv's tier inside vLLM 0.33.0's real scheduler (``make test-vllm``).

Collected only where ``vllm`` is importable (the main suite does not install it: these
tests are not collected there rather than skipped). The stores are the page-store tests'
fixtures: a fresh memory:// name, and a throwaway redis-server on loopback (a missing one
fails under ``CI=true`` and skips elsewhere).
"""

from __future__ import annotations

import importlib.util

import pytest

from ..store.conftest import _quiet_first_backend_error, memory_url, redis_server  # noqa: F401 (fixtures)

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["test_*.py", "harness.py"]


@pytest.fixture
def redis_url(redis_server):
    """The redis:// URL of a throwaway loopback redis-server."""
    return f"redis://127.0.0.1:{redis_server.port}"


@pytest.fixture(params=["memory", "redis"])
def store_url(request):
    """Each test twice: an in-process store, then a real redis-server on loopback."""
    return request.getfixturevalue(f"{request.param}_url")
