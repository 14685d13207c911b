"""`radixkv cluster --policy belady`: each instance gets its own future, or the command refuses."""

from __future__ import annotations

import json

import pytest

from radixkv import PrefixCache
from radixkv.cluster import Cluster
from radixkv.workload.generators import generate
from radixkv.analysis.replay import replay
from radixkv.tiers import TierConfigError

from ..tiers.test_tiers_cli import TRACE, run

PS = 16


@pytest.fixture(scope="module")
def mix():
    return list(generate("mix", 3, 400))


def instance_hits(cluster: Cluster) -> list:
    return [inst.cache.hit_tokens_by_tier["hbm"] for inst in cluster.instances]


@pytest.mark.parametrize("routing", ["round_robin", "least_loaded", "cache_aware"])
def test_one_instance_equals_replay_with_belady(mix, routing):
    # Failed before: the cluster never gave Belady its future (a lower hit rate than LRU's).
    for blocks in (64, 256, 1024):
        alone = replay(mix, PrefixCache(blocks, PS, "belady"), miss_reasons=False).hit_tokens
        cluster = Cluster(1, blocks, PS, "belady", routing=routing)
        assert cluster.replay(mix).hit_tokens == alone
        cluster.check()


def test_each_round_robin_instance_equals_belady_on_its_share_from_the_cursor_on(mix):
    n = 3
    first, second = mix[:7], mix[7:]  # 7 requests: the second replay starts at instance 1
    cluster = Cluster(n, 128, PS, "belady")
    cluster.replay(first)
    result = cluster.replay(second)
    alone = []
    for k in range(n):
        cache = PrefixCache(128, PS, "belady")
        hits = replay(first[k::n], cache, miss_reasons=False).hit_tokens
        alone.append(hits + replay(second[(k - 1) % n::n], cache, miss_reasons=False).hit_tokens)
    assert instance_hits(cluster) == alone
    lru = Cluster(n, 128, PS, "lru").replay(second)
    assert result.hit_tokens > lru.hit_tokens
    cluster.check()


def test_belady_with_borrowing_keeps_the_ledger(mix):
    cluster = Cluster(3, 64, PS, "belady", borrowing=True, lend_cap=1.0, low_watermark=0.0)
    result = cluster.replay(mix)
    assert result.blocks_lent > 0
    cluster.check()


@pytest.mark.parametrize("routing", ["least_loaded", "cache_aware"])
def test_routing_by_cache_state_refuses_an_offline_policy(routing):
    with pytest.raises(TierConfigError, match=f"routing '{routing}'"):
        Cluster(2, 64, PS, "belady", routing=routing)


def test_cluster_command_belady_on_one_instance_equals_replay():
    common = [TRACE, "--num-blocks", "2000", "--limit", "200", "--policy", "belady", "--json"]
    code, out = run("replay", *common, "--quiet", "--no-miss-reasons")
    assert code == 0, out
    expected = json.loads(out.strip().splitlines()[-1])["hit_tokens"]
    code, out = run("cluster", *common, "--instances", "1")
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["hit_tokens"] == expected


def test_cluster_command_refuses_belady_with_cache_aware_routing():
    code, out = run("cluster", TRACE, "--num-blocks", "2000", "--limit", "20", "--policy", "belady",
                    "--instances", "2", "--routing", "cache_aware")
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("radixkv: error: --policy belady") and "--routing cache_aware" in lines[0]
