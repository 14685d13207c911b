"""Defects at the seams after issue 11's fixes: each repro_N raises AssertionError while its defect is present."""

from __future__ import annotations

import subprocess
import sys
import traceback

import numpy as np


def _check_passes(cache) -> bool:
    try:
        cache.check()
        return True
    except AssertionError:
        return False


# 1. Admission.abort() under s3fifo / 2q / adaptive raises AttributeError half way (after the subtree
#    was cut from the tree): blocks leak, check() fails for good, and `with cache.admit(...)` replaces
#    the model's exception with an AttributeError.
def repro_1():
    from radixkv import PrefixCache

    for policy in ("s3fifo", "2q", "adaptive"):
        cache = PrefixCache(8, page_size=2, policy=policy)
        a = cache.admit([1, 1, 2, 2])
        try:
            a.abort()
        except AttributeError as exc:  # 'Node' object has no attribute 'namespace'
            raise AssertionError(f"{policy}: Admission.abort raised {exc!r}; check passes: "
                                 f"{_check_passes(cache)}, held blocks {cache.num_held_blocks}") from None
        cache.check()
        assert cache.num_held_blocks == 0


# 2. reset() leaves the old namespace roots with their (dead) children; a root handle issued before
#    the reset (any miss: match().node) is adopted by lock() afterwards, and the next admit is served
#    blocks the reset put back in the free pool: WRONG KV.
def repro_2():
    from radixkv import PrefixCache

    cache = PrefixCache(4, page_size=2, kv_shape=(1,))
    a = cache.admit([1, 1, 2, 2])
    cache.write(a.new_blocks, np.ones((2, 2, 1)))
    a.release()
    handle = cache.match([9, 9]).node            # a miss: the handle of the namespace's root
    cache.reset()
    other = cache.admit([5, 5, 6, 6], namespace="tenant-b")   # another tenant takes the freed blocks
    cache.write(other.new_blocks, np.full((2, 2, 1), 5.0))
    other.release()
    cache.lock(handle)                           # adopts the pre-reset root, children and all
    b = cache.admit([1, 1, 2, 2])
    assert b.hit_tokens == 0, (f"after reset, [1,1,2,2] is a {b.hit_tokens}-token hit in blocks "
                               f"{b.blocks.tolist()} which hold tenant-b's KV {cache.read(b.blocks).ravel().tolist()}; "
                               f"check passes: {_check_passes(cache)}")


# 3. Issue 11 item 4 is not fixed: BorrowedTier.recall drops a page while the deeper page of its chain
#    stays lent at another creditor (unreachable, holding that creditor's HBM block), and check() passes.
def repro_3():
    from radixkv.cluster import Cluster

    c = Cluster(3, num_blocks=4, page_size=2, borrowing=True, lend_cap=1.0, low_watermark=0.0, candidates=1)
    m, cache = c.manager, c.instances[0].cache
    cache.admit([1, 1, 2, 2, 3, 3, 4, 4]).release()   # 4 pages fill instance 0's HBM
    m.reported_free[1], m.reported_free[2] = 0, 9
    cache.admit([5, 5, 6, 6]).release()               # pages 2..4 of it -> lent by instance 2
    m.reported_free[1], m.reported_free[2] = 9, 0
    cache.admit([7, 7, 8, 8]).release()               # pages 0..2 -> lent by instance 1
    c.check()
    c.instances[2].available = False                  # the head page cannot move: it is dropped
    m.recall(1, 2)
    reachable = sum(cache.peek([1, 1, 2, 2, 3, 3, 4, 4]))
    stranded = m.lent(2)
    check_ok = True
    try:
        c.check()
    except AssertionError:
        check_ok = False
    assert not (stranded and not reachable and check_ok), (
        f"instance 2 still lends {stranded} blocks holding pages nobody can reach, and Cluster.check() passes")


# 4. Issue 11 item 11 is not fixed: `radixkv cluster --policy belady` runs without the future, exit 0,
#    and a one-instance cluster differs from `radixkv replay --policy belady` (it equals LRU).
def repro_4():
    import json

    trace = "/work/shared/traces/mooncake_conversation.jsonl"

    def run(*args):
        out = subprocess.run([sys.executable, "-m", "radixkv", *args, "--json"], capture_output=True, text=True)
        return out.returncode, out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""

    rc, line = run("cluster", trace, "--instances", "1", "--num-blocks", "200", "--policy", "belady",
                   "--limit", "300")
    if rc == 2:
        return  # refused: fine
    cluster_rate = json.loads(line)["token_hit_rate"]
    _, line = run("replay", trace, "--num-blocks", "200", "--policy", "belady", "--limit", "300")
    replay_rate = json.loads(line)["token_hit_rate"]
    assert rc == 2 or abs(cluster_rate - replay_rate) < 1e-12, (
        f"cluster --policy belady: exit {rc}, hit rate {cluster_rate} != replay belady {replay_rate}")


# 5. The stranded-copy class is open below HBM too: when a tier's write fails during a cascade (or the
#    page fails its checksum on the way down), the shallower page is dropped while its deeper copy stays
#    in the next tier, unreachable (its prefix is nowhere), holding a slot; check() passes.
def repro_5():
    import warnings

    from radixkv.tiers import HostTier, TieredCache
    from radixkv.tiers.base import Copy

    class FailingWrites(HostTier):
        fail = False

        def write(self, slots, pages):
            if self.fail:
                raise RuntimeError("injected: write")
            return super().write(slots, pages)

    host, remote = HostTier(2), FailingWrites(4, name="remote")
    cache = TieredCache(2, page_size=2, kv_shape=(1,), tiers=[host, remote], load_back="always")

    def serve(tokens):
        a = cache.admit(tokens)
        if len(a.new_blocks):
            cache.write(a.new_blocks, np.ones((len(a.new_blocks), 2, 1)))
        a.release()

    for t in ([1, 1, 2, 2], [3, 3], [4, 4], [5, 5]):   # [1,1] on the host, [2,2] (below it) on the remote tier
        serve(t)
    remote.fail = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        serve([6, 6])                                   # the host cascades [1,1]: the remote write raises
    stranded = [n for n in cache._stack.tree.nodes() if isinstance(n.ext, Copy)
                and all(not isinstance(a.ext, Copy) for a in _ancestors(n))
                and n.start > 0 and cache.peek([1, 1, 2, 2]) == (0, 0)]
    ok = _check_passes(cache)
    assert not (stranded and ok), (f"{stranded[0]} holds a copy in {stranded[0].ext.tier.name} that no lookup "
                                   "can reach (page 0 is neither in HBM nor below), and check() passes")


def _ancestors(node):
    out = []
    node = node.parent
    while node is not None and node.parent is not None:
        out.append(node)
        node = node.parent
    return out


# 6. A NodeHandle of another cache is accepted by lock(): it locks the other cache's nodes and counts them
#    protected here; both caches fail check() and the other cache can no longer evict those pages.
def repro_6():
    from radixkv import PrefixCache
    from radixkv.errors import RadixKVError

    x, y = PrefixCache(8, page_size=2), PrefixCache(8, page_size=2)
    x.admit([1, 1, 2, 2]).release()
    handle = x.match([1, 1, 2, 2]).node
    try:
        y.lock(handle)
    except RadixKVError:
        return
    assert _check_passes(x) and _check_passes(y), (
        f"y.lock(x's handle) was accepted: x check {_check_passes(x)}, y check {_check_passes(y)}, "
        f"x.evict(2) frees {x.evict(2)}")


# 7. RedisBackend keys are "<namespace>:<slot>" but clear()/close() delete by the glob "<namespace>:*":
#    closing the cache whose namespace is "team" deletes the pages of a cache sharing the server under
#    "team:eu" (and a namespace holding glob characters, "t[1]", never clears its own keys).
def repro_7():
    from radixkv.testing.localredis import LocalRedis
    from radixkv.tiers.redis_backend import RedisBackend

    with LocalRedis() as server:
        a = RedisBackend([server.url], namespace="team")
        b = RedisBackend([server.url], namespace="team:eu")
        try:
            b.put(0, [0, 1], [b"x", b"y"])
            a.put(0, [0], [b"z"])
            a.close()
            got = b.get(0, [0, 1])
            assert got == [b"x", b"y"], f"closing namespace 'team' deleted namespace 'team:eu''s pages: {got}"
        finally:
            b.close()
        globbed = RedisBackend([server.url], namespace="t[1]*?\\")
        globbed.put(0, [0, 7], [b"p", b"q"])
        globbed.close()
        import redis

        left = redis.Redis.from_url(server.url).keys("*")
        assert left == [], f"closing namespace 't[1]*?\\' left its keys behind: {left}"


def main(argv) -> int:
    names = sorted((n for n in globals() if n.startswith("repro_")), key=lambda n: int(n.split("_")[1]))
    if len(argv) > 1:
        names = [f"repro_{a}" for a in argv[1:]]
    failed = 0
    for name in names:
        try:
            globals()[name]()
            print(f"{name}: no bug")
        except AssertionError as exc:
            failed += 1
            print(f"{name}: BUG: {exc}")
        except Exception:
            failed += 1
            print(f"{name}: ERROR")
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
