"""Spill-layer benchmarks on the Mooncake conversation trace (page 16); one JSON line per run.

    .venv/bin/python bench/perf/tiers.py tiers > bench/results/tiers_hbm_host.jsonl   # also cluster, redis:
    .venv/bin/python bench/perf/tiers.py cluster > bench/results/tiers_cluster.jsonl  # tiers_<which>.jsonl

* ``tiers``: HBM 3M tokens (187,488 blocks) over a host tier of 0 / 3M / 12M tokens, each write
  policy: hit rate by tier, bytes per link, simulated transfer seconds; plus the single LRU of
  HBM + host blocks that write-back must equal.
* ``cluster``: 4 instances x 3M tokens, round robin vs cache-aware, with and without lending.
* ``redis``: the same replay (a slice, with real payload bytes) through in-process simulated
  remote hosts and through two local redis-server processes: hit counts and wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from radixkv.cache import PrefixCache
from radixkv.cluster import Cluster
from radixkv.analysis.replay import replay
from radixkv.tiers import HostTier, RedisBackend, RemoteTier, TieredCache
from radixkv.testing.localredis import LocalRedis
from radixkv.workload.traces import TraceReader

TRACE = "../shared/traces/mooncake_conversation.jsonl"
HBM = 187_488  # 3M tokens at page 16
PAGE = 16


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def tier_rows(requests) -> None:
    for host in (0, HBM, 4 * HBM):
        plain = replay(requests, PrefixCache(HBM + host, PAGE))
        emit({"bench": "tiers", "config": f"single LRU of {HBM + host} blocks", "num_blocks": HBM + host,
              "hit_rate": plain.token_hit_rate, "hit_tokens": plain.hit_tokens, "wall_seconds": plain.wall_seconds})
        policies = ("write_back", "write_through", "write_through_selective") if host else ("write_back",)
        for policy in policies:
            cache = TieredCache(HBM, PAGE, tiers=[HostTier(host)] if host else [], write_policy=policy)
            r = replay(requests, cache)
            s = cache.tier_stats()
            emit({"bench": "tiers", "host_blocks": host, "host_tokens": host * PAGE, "write_policy": policy,
                  "hit_rate": r.token_hit_rate, "hit_tokens": r.hit_tokens,
                  "hit_rate_by_tier": {k: v / r.prompt_tokens for k, v in s.hit_tokens_by_tier.items()},
                  "equals_single_lru": r.hit_tokens == plain.hit_tokens,
                  "bytes_by_link": s.bytes_by_link, "bytes_by_route": s.bytes_by_route,
                  "transfer_seconds": s.transfer_seconds, "recomputed_tokens": s.recomputed_tokens,
                  "dropped_pages": s.dropped_pages, "wall_seconds": r.wall_seconds})


def cluster_rows(requests) -> None:
    for routing in ("round_robin", "cache_aware"):
        for borrowing in (False, True):
            r = Cluster(4, HBM, PAGE, routing=routing, borrowing=borrowing).replay(requests)
            row = r.as_dict()
            row["bench"] = "cluster"
            row["hit_rate_by_tier"] = {k: v / r.prompt_tokens for k, v in r.hit_tokens_by_tier.items()}
            emit(row)


def redis_rows(requests) -> None:
    kv = (2, 8)  # 16 tokens x 2 x 8 float16 = 512 payload bytes per page
    hbm, host, remote = 4_000, 16_000, 80_000  # reuse in the first 1,500 requests needs ~100k blocks

    def run(backend_label, tier):
        cache = TieredCache(hbm, PAGE, kv_shape=kv, tiers=[HostTier(host), tier], load_back="always")
        t = time.perf_counter()
        r = replay(requests, cache)
        wall = time.perf_counter() - t
        cache.check()
        emit({"bench": "redis", "backend": backend_label, "requests": r.requests, "hit_tokens": r.hit_tokens,
              "hit_tokens_by_tier": cache.hit_tokens_by_tier, "bytes_by_link": cache.transfers.bytes_by_link,
              "wall_seconds": wall})
        cache.close()
        return r.hit_tokens

    sim = run("in-process", RemoteTier(remote // 2, num_hosts=2))
    with LocalRedis() as a, LocalRedis() as b:
        real = run("redis x2", RemoteTier(remote // 2, backend=RedisBackend([a.url, b.url])))
    emit({"bench": "redis", "identical_hits": sim == real})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", nargs="?", default="all", choices=["tiers", "cluster", "redis", "all"])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--redis-limit", type=int, default=1500)
    args = parser.parse_args()
    requests = list(TraceReader(TRACE, limit=args.limit))
    if args.which in ("tiers", "all"):
        tier_rows(requests)
    if args.which in ("cluster", "all"):
        cluster_rows(requests)
    if args.which in ("redis", "all"):
        redis_rows(requests[: args.redis_limit])


if __name__ == "__main__":
    sys.exit(main())
