"""radixkv through the peers' timing loop (what ``compare.py`` and ``token_input.py`` replay).

Needs only radixkv and numpy, so it runs in the repository's own venv as well as
in ``bench/peers/.venv``.

Import: ``replay_radixkv(requests_iter, page_size, num_blocks) -> dict``.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

from radixkv import PrefixCache  # noqa: E402


def replay_radixkv(requests, page_size: int = 16, num_blocks: int = 187488, per_request_ns=None) -> dict:
    """The same loop as the peer drivers: per request admit + release, timed around the cache calls.

    ``requests`` may be a generator: producing each request's tokens (in whatever
    form) happens outside the timed region. ``per_request_ns``, a list, receives
    each request's time in nanoseconds.
    """
    cache = PrefixCache(num_blocks=num_blocks, page_size=page_size)
    tally = _common.Tally()
    clock = time.perf_counter_ns
    wall0 = time.perf_counter()
    for tokens in requests:
        t0 = clock()
        adm = cache.admit(tokens)
        adm.release()
        tally.ns.append(clock() - t0)
        tally.requests += 1
        tally.prompt_tokens += len(tokens)
        tally.hit_tokens += adm.hit_tokens
    tally.wall = time.perf_counter() - wall0
    if per_request_ns is not None:
        per_request_ns.extend(tally.ns)
    return tally.summary()
