"""The seam below HBM: PrefixCache calls a LowerLayer at its named points, a toy layer built only on
the public surface can demote and load pages back, and the tier modules reach into no engine or
stack internals."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PrefixCache
from radixkv.errors import ArgumentTypeError, InvalidBlocksError
from radixkv.lower import Load, LowerLayer

ROOT = pathlib.Path(__file__).resolve().parents[2]


def path_key(node) -> tuple:
    """(root, bytes of every page from the root through ``node``)."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return node, b"".join(reversed(parts))


class DictLayer(LowerLayer):
    """A toy host tier: evicted pages (payload rows) in a dict keyed by (root, prefix bytes)."""

    def __init__(self) -> None:
        self.pages = {}
        self.calls = []

    def bind(self, cache):
        self.cache = cache
        self.pb = cache.page_size * 4  # uint32 tokens

    def evicting(self, node, k):
        self.calls.append(("evicting", k))
        root, key = path_key(node)
        rows = self.cache.payload[node.blocks[node.num_pages - k:]]
        for i, page in enumerate(range(node.end - k, node.end)):
            self.pages[(root, key[: (page + 1) * self.pb])] = rows[i].copy()

    def lookup(self, root, key, node, pos, num_pages, use):
        self.calls.append(("lookup", pos, use))
        run = []
        while pos + len(run) < num_pages and (root, key[: (pos + len(run) + 1) * self.pb]) in self.pages:
            run.append((root, key[: (pos + len(run) + 1) * self.pb]))
        return run or None

    def prepare_load(self, found, pos, room, use):
        take = found[:room]
        self.calls.append(("prepare_load", len(found), room))
        return Load(len(take), np.stack([self.pages.pop(k) for k in take]) if take else None, len(take))

    def complete_load(self, load, use):
        self.calls.append(("complete_load", load.receipt))

    def admitted(self, root, key, start, new_blocks):
        self.calls.append(("admitted", start, len(new_blocks)))
        return ("record", start)

    def written(self, record, node):
        self.calls.append(("written", record))

    def unwritten(self, record):
        self.calls.append(("unwritten", record))

    def inserted(self, root, key, start, blocks):
        self.calls.append(("inserted", start, len(blocks)))

    def split(self, upper, lower):
        self.calls.append(("split", upper.num_pages, lower.num_pages))

    def check(self):
        self.calls.append(("check",))

    def reset(self):
        self.pages.clear()
        self.calls.append(("reset",))

    def close(self):
        self.calls.append(("close",))


def page_rows(tokens, page_size=2):
    """A payload per page that is a function of the prefix through it (so a wrong page shows)."""
    return np.array([[[sum(tokens[: (p + 1) * page_size]) + p]] * page_size
                     for p in range(len(tokens) // page_size)], dtype=np.float32).reshape(-1, page_size, 1)


def test_a_layer_on_public_methods_demotes_and_loads_back_the_right_payload():
    layer = DictLayer()
    cache = PrefixCache(4, page_size=2, kv_shape=(1,), dtype="float32", lower=layer)
    a, b = [1, 2, 3, 4, 5, 6], [9, 9, 8, 8, 7, 7]
    with cache.admit(a) as adm:
        cache.write(adm.new_blocks, page_rows(a))
    assert ("admitted", 0, 3) in layer.calls and ("written", ("record", 0)) in layer.calls
    with cache.admit(b) as adm:  # 2 pages of a go below HBM
        cache.write(adm.new_blocks, page_rows(b))
    assert ("evicting", 2) in layer.calls and len(layer.pages) == 2
    cache.check()
    m = cache.admit(a)  # the tail of a comes back from the layer into blocks the engine freed (b's)
    assert m.hit_tokens == 6 and len(m.new_blocks) == 0
    assert np.array_equal(cache.read(m.blocks), page_rows(a))
    assert ("complete_load", 2) in layer.calls and len(layer.pages) == 2  # a's tail came up, b's went down
    m.release()
    cache.check()
    assert layer.calls[-1] == ("check",)


def test_the_engine_calls_the_layer_at_every_named_point():
    layer = DictLayer()
    cache = PrefixCache(8, page_size=2, lower=layer)
    cache.admit([1, 1, 2, 2]).release()
    assert layer.calls[:3] == [("lookup", 0, True), ("admitted", 0, 2), ("written", ("record", 0))]
    cache.match([1, 1, 3, 3])  # ends inside the node: a split
    assert ("split", 1, 1) in layer.calls
    cache.pin([1, 1])
    assert layer.calls[-1] == ("lookup", 1, False)  # a pin is no use
    cache.unpin([1, 1])
    adm = cache.admit([5, 5, 6, 6])
    adm.abort()
    assert layer.calls[-1] == ("unwritten", ("record", 0))
    blocks = cache.allocate(2)
    cache.insert([7, 7, 8, 8], blocks)
    assert layer.calls[-1] == ("inserted", 0, 2)
    cache.reset()
    assert layer.calls[-1] == ("reset",)
    cache.close()
    assert layer.calls[-1] == ("close",)
    cache.check()


@settings(deadline=None)
@given(ops=st.lists(st.lists(st.integers(0, 3), max_size=10), min_size=1, max_size=30))
def test_with_the_base_layer_the_cache_behaves_as_without_one(ops):
    from ..strategies import snapshot
    plain, seamed = PrefixCache(5, page_size=2), PrefixCache(5, page_size=2, lower=LowerLayer())
    for tokens in ops:
        for cache in (plain, seamed):
            a = cache.admit(tokens)
            a.abort() if tokens and tokens[0] == 3 else a.release()
            cache.check()
        assert snapshot(plain) == snapshot(seamed)


def test_lower_must_be_a_lower_layer():
    with pytest.raises(ArgumentTypeError):
        PrefixCache(4, lower=object())


def test_peek_victim_names_what_eviction_takes_next_and_changes_nothing():
    cache = PrefixCache(8, page_size=2)
    assert cache.peek_victim() is None
    cache.admit([1, 1, 2, 2]).release()
    cache.admit([3, 3]).release()
    cache.match([3, 3])
    retention, _, pages = cache.peek_victim()
    assert (retention, pages) == (0, 2) and cache.peek_victim() == cache.peek_victim()
    assert cache.evict(2) == 2 and cache.cached_pages([1, 1, 2, 2]) == 0 and cache.cached_pages([3, 3]) == 1


def test_advance_clock_only_moves_forward():
    cache = PrefixCache(4)
    cache.advance_clock(10)
    cache.advance_clock(3)
    assert cache.clock == 10
    with pytest.raises(ArgumentTypeError):
        cache.advance_clock(1.5)
    assert cache.clock == 10


def test_are_held_and_release_root_check_their_arguments():
    cache = PrefixCache(4, page_size=2)
    held = cache.allocate(2)
    assert cache.are_held(held) and not cache.are_held([2])
    with pytest.raises(InvalidBlocksError):
        cache.are_held([99])
    with pytest.raises(ArgumentTypeError):
        cache.release_root("root")


_MODULES = ["radixkv/tiers/tiered.py", "radixkv/tiers/lending.py", "radixkv/cluster.py"]


@pytest.mark.parametrize("path", _MODULES)
def test_tier_modules_reach_into_no_other_object(path):
    text = (ROOT / path).read_text()
    reach = [line for line in text.splitlines()
             if re.search(r"\b[a-z_]+\.(_[a-z][a-z_0-9]*)", line) and not re.search(r"\bself\._", line)]
    assert not reach, reach


def test_tiered_cache_uses_no_private_member_of_prefix_cache():
    engine = (ROOT / "radixkv/cache.py").read_text()
    private = set(re.findall(r"self\.(_[a-z][a-z_0-9]*)", engine)) | set(re.findall(r"def (_[a-z][a-z_0-9]*)\(", engine))
    used = set(re.findall(r"self\.(_[a-z][a-z_0-9]*)", (ROOT / "radixkv/tiers/tiered.py").read_text()))
    assert not used & private, sorted(used & private)


def spill_state(cache):
    """Every spill-tree node as (namespace, path bytes, tier, slots, sums), and the tier counters."""
    from radixkv.tiers import Copy
    nodes = set()
    for node in cache._stack.tree.nodes():
        root, data = cache._path_data(node)
        ext = node.ext
        nodes.add((root.namespace.namespace, data, ext.tier.name if isinstance(ext, Copy) else None,
                   tuple(ext.slots.tolist()) if isinstance(ext, Copy) else (),
                   tuple(ext.sums.tolist()) if isinstance(ext, Copy) and ext.sums is not None else ()))
    return nodes, cache.tier_stats()


# Two token values and long requests: deep trees, so most demotions start below an anchored node.
_reqs = st.lists(st.tuples(st.sampled_from([None, "t"]), st.lists(st.integers(0, 1), max_size=20),
                           st.sampled_from(["release", "release", "match", "abort", "pin", "reset"])),
                 min_size=1, max_size=40)


@settings(deadline=None)
@given(ops=_reqs, policy=st.sampled_from(["lru", "lfu", "fifo"]))
def test_demoting_from_anchors_builds_the_spill_tree_a_walk_from_the_root_does(ops, policy):
    from radixkv.tiers import HostTier, RemoteTier, TieredCache
    twins = [TieredCache(8, 2, policy, kv_shape=(1,), dtype="float32", load_back="always",
                         tiers=[HostTier(4), RemoteTier(blocks_per_host=3, num_hosts=2)]) for _ in range(2)]
    twins[1].lower.anchored = False
    for ns, tokens, how in ops:
        for cache in twins:
            if how == "reset":
                cache.reset()
            elif how == "match":  # splits nodes whose anchors stay with the lower part
                cache.match(tokens, namespace=ns)
            elif how == "pin":
                if cache.pin(tokens, namespace=ns):  # loads the prefix back, then lets it go
                    cache.unpin(tokens, namespace=ns)
            else:
                a = cache.admit(tokens, namespace=ns)
                cache.write(a.new_blocks, page_rows(tokens)[len(a.blocks) - len(a.new_blocks):len(a.blocks)])
                a.release() if how == "release" else a.abort()
            cache.check()
        assert spill_state(twins[0]) == spill_state(twins[1])
        assert twins[0].hit_tokens_by_tier == twins[1].hit_tokens_by_tier


def test_an_anchor_left_on_the_upper_part_of_a_split_is_not_trusted():
    # Here an HBM node comes to carry an anchor that does not end where the node does (the upper
    # part of a split inherits the lower part's): a demotion below it must walk from the root.
    from radixkv.tiers import HostTier, RemoteTier, TieredCache
    twins = [TieredCache(8, 2, kv_shape=(1,), dtype="float32", load_back="always",
                         tiers=[HostTier(4), RemoteTier(blocks_per_host=3, num_hosts=2)]) for _ in range(2)]
    twins[1].lower.anchored = False
    for tokens in ([0, 0, 1, 1], [0, 1, 0, 1, 1, 0, 1, 0, 0, 1], [0, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1],
                   [0, 1, 1, 0, 0, 0, 0, 1, 1, 0], [0, 1, 0, 1, 1, 1, 1, 0], [0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1]):
        for cache in twins:
            cache.admit(tokens).release()
            cache.check()
        assert spill_state(twins[0]) == spill_state(twins[1])
