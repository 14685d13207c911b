"""MooncakeBlocks: the one interning of Mooncake hash-id prefixes (LRU curve and sweep share it)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixkv.workload.traces import MooncakeBlocks

PROMPTS = st.lists(st.tuples(st.lists(st.integers(0, 4), max_size=5), st.sampled_from([None, "a", "b"])),
                   max_size=12)


@given(PROMPTS)
def test_equal_ids_iff_equal_prefix_in_one_namespace(prompts):
    blocks = MooncakeBlocks()
    named: dict = {}
    for hash_ids, namespace in prompts:
        ids = blocks.ids(hash_ids, namespace)
        assert len(ids) == len(hash_ids)
        for k, block_id in enumerate(ids):
            prefix = (namespace, tuple(hash_ids[:k + 1]))
            assert named.setdefault(prefix, block_id) == block_id
    assert len(set(named.values())) == len(named)
    assert sorted(named.values()) == list(range(len(named)))


def test_ids_are_dense_and_do_not_trust_the_trace_to_chain():
    blocks = MooncakeBlocks()
    assert blocks.ids([7, 9]) == [0, 1]
    assert blocks.ids([9]) == [2]
    assert blocks.ids([7, 9, 9]) == [0, 1, 3]
    assert blocks.ids([7], "t1") == [4]
