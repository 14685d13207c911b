"""The Redis plumbing radixkv's two Redis users share: loading redis-py, its transport errors, clients from URLs.

:mod:`radixkv.tiers.redis_backend` (one server per remote host) and
:mod:`radixkv.store.redis_backends` (the shared page store) both go through
here, so a URL means the same thing to both and a dead server raises the same
exceptions in both.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Optional, Tuple, Type

from ..errors import MissingExtraError


def load_redis(error: Type[Exception] = MissingExtraError) -> ModuleType:
    """redis-py, imported on first use; ``error`` (naming the extra to install) when it is missing."""
    try:
        import redis
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise error("the Redis backend needs redis-py: pip install 'radixkv[redis]'") from None
    return redis


def transport_errors(redis: ModuleType) -> Tuple[Type[BaseException], ...]:
    """What a call raises when the server does not answer: refused, reset, timed out, unreachable.

    Error *replies* (``ResponseError``: out of memory, wrong type, ``MOVED``)
    are not among them: the server answered.
    """
    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def client_from_url(url: str, timeout: float, *, retries: Optional[int] = None, **options: Any) -> Any:
    """A ``redis.Redis`` for ``url`` (``redis://host:port/db``, ``rediss://``, ``unix://``); no round trip yet.

    ``timeout`` bounds both connecting and every read, in seconds. ``retries``
    0 makes a call that finds the server gone fail at once instead of
    retrying with redis-py's backoff (10 attempts by default in redis-py 8);
    ``None`` keeps redis-py's default. Raises ``ValueError`` for a URL redis-py
    cannot parse.
    """
    redis = load_redis()
    if retries is not None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options["retry"] = Retry(NoBackoff(), retries)
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, **options)
