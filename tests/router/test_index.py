"""KVIndex: a view of every instance's pages built from KV event batches alone, exact under lost,
repeated and reordered batches, restarts and clears; bad payloads counted, never raised."""

from __future__ import annotations

import msgspec
import pytest

from radixkv.errors import ArgumentTypeError, ArgumentValueError
from radixkv.events import AllBlocksCleared, BlockRemoved, BlockStored
from radixkv.events.wire import encode_batch
from radixkv.router import KVIndex
from radixkv.router.index import APPLIED, DUPLICATE, HELD, LATE, RESTARTED

from ..events.vllm_router import BlockRemoved as VBlockRemoved
from ..events.vllm_router import BlockStored as VBlockStored
from ..events.vllm_router import KVEventBatch as VBatch

GPU, CPU = ("GPU", None), ("CPU", None)


def stored(hashes, medium="GPU", ts=0.0):
    return encode_batch([BlockStored(list(hashes), None, [0] * len(hashes), 1, medium=medium)], ts=ts)


def removed(hashes, medium="GPU", ts=0.0):
    return encode_batch([BlockRemoved(list(hashes), medium)], ts=ts)


def test_stored_removed_and_overlap_per_instance_and_medium():
    index = KVIndex()
    assert index.apply("a", 0, stored([1, 2, 3])) == APPLIED
    assert index.apply("b", 0, stored([1, 2])) == APPLIED
    assert index.apply("b", 1, stored([3, 4], "CPU")) == APPLIED
    assert index.overlap([1, 2, 3, 4, 5]) == {"a": 3, "b": 4}
    assert index.block_hashes("b") == {1, 2, 3, 4}
    assert index.block_hashes("b", CPU) == {3, 4} and index.block_hashes("b", GPU) == {1, 2}
    assert index.apply("a", 1, removed([2])) == APPLIED
    assert index.overlap([1, 2, 3]) == {"a": 1, "b": 3}          # a's hole ends its run
    index.apply("b", 2, removed([3], "CPU"))
    assert index.overlap([1, 2, 3, 4]) == {"a": 1, "b": 2}
    assert index.block_hashes("b") == {1, 2, 4} and len(index) == 4
    assert index.overlap([9, 1]) == {"a": 0, "b": 0}
    index.check()


def test_a_page_on_two_media_counts_once_and_leaves_with_its_last_copy():
    index = KVIndex()
    index.apply("a", 0, stored([1, 2]))
    index.apply("a", 1, stored([2], "CPU"))
    assert index.status("a").blocks == 2
    index.apply("a", 2, removed([2]))
    assert index.overlap([1, 2]) == {"a": 2} and index.block_hashes("a", CPU) == {2}
    index.apply("a", 3, removed([2], "CPU"))
    assert index.overlap([1, 2]) == {"a": 1} and index.status("a").blocks == 1
    index.check()


def test_runs_weigh_each_page_by_its_best_medium():
    index = KVIndex()
    index.apply("a", 0, stored([1, 2]))
    index.apply("a", 1, stored([3], "CPU"))
    index.apply("b", 0, stored([1, 2, 3]))
    g, c = index.media.index(GPU), index.media.index(CPU)
    weights = [0.0, 0.0]
    weights[g], weights[c] = 1.0, 0.25
    pages, worth = index.runs([1, 2, 3, 4], weights)
    a, b = index.slot("a"), index.slot("b")
    assert pages == {a: 3, b: 3} and worth == {a: 2.25, b: 3.0}


def test_all_blocks_cleared_empties_only_that_instance_where_it_sits_in_the_batch():
    index = KVIndex()
    index.apply("a", 0, stored([1, 2]))
    index.apply("b", 0, stored([1, 2]))
    batch = encode_batch([AllBlocksCleared(), BlockStored([7], None, [0], 1)])
    index.apply("a", 1, batch)
    assert index.block_hashes("a") == {7} and index.block_hashes("b") == {1, 2}
    assert index.status("a").clears == 1 and index.status("a").blocks == 1
    index.check()


def test_a_duplicate_is_applied_once():
    index = KVIndex()
    index.apply("a", 0, stored([1]))
    index.apply("a", 1, removed([1]))
    assert index.apply("a", 0, stored([1])) == DUPLICATE
    assert index.block_hashes("a") == set() and index.status("a").duplicates == 1


def test_a_gap_holds_later_batches_until_the_replay_fills_it():
    index = KVIndex()
    index.apply("a", 0, stored([1]))
    assert index.replay_from("a") is None
    assert index.apply("a", 2, stored([3])) == HELD
    assert index.apply("a", 3, stored([4])) == HELD
    st = index.status("a")
    assert st.stale and st.gaps == 1 and st.held == 2 and index.replay_from("a") == 0  # one before: a check
    assert index.block_hashes("a") == {1}
    assert index.apply("a", 0, stored([1])) == DUPLICATE      # the replay's first batch matches: same stream
    assert index.apply("a", 1, stored([2])) == APPLIED
    assert index.block_hashes("a") == {1, 2, 3, 4} and not index.status("a").stale
    assert index.apply("a", 2, stored([3])) == DUPLICATE       # the rest of the replay
    assert index.status("a").next_seq == 4 and index.status("a").exact


def test_a_restarted_publisher_resets_the_view():
    index = KVIndex()
    index.apply("a", 0, stored([1], ts=1.0))
    index.apply("a", 1, stored([2], ts=1.0))
    assert index.apply("a", 0, stored([5], ts=2.0)) == RESTARTED   # number 0 again, other bytes
    assert index.block_hashes("a") == {5} and index.status("a").restarts == 1
    # a restart seen first through a gap: the replay's first batch (one before the gap) differs
    assert index.apply("a", 3, stored([8], ts=3.0)) == HELD
    assert index.replay_from("a") == 0
    assert index.apply("a", 0, stored([6], ts=3.0)) == RESTARTED
    assert index.replay_from("a") is None and index.block_hashes("a") == {6}
    index.check()


def test_lost_batches_skip_ahead_marked_inexact_and_a_late_one_is_ignored():
    index = KVIndex()
    index.apply("a", 0, stored([1]))
    index.apply("a", 3, stored([4]))
    assert index.lost("a") == 2
    st = index.status("a")
    assert not st.exact and st.lost == 2 and st.next_seq == 4 and index.block_hashes("a") == {1, 4}
    assert index.apply("a", 2, stored([3])) == LATE and index.block_hashes("a") == {1, 4}
    assert index.lost("a") == 0


def test_too_many_held_batches_give_the_oldest_gap_up():
    index = KVIndex(max_held=2)
    for seq in (2, 3, 4):
        index.apply("a", seq, stored([seq]))
    assert index.status("a").lost == 2 and index.block_hashes("a") == {2, 3, 4}


def test_malformed_payloads_and_unknown_events_are_counted_and_skipped():
    index = KVIndex()
    index.apply("a", 0, b"\xc1not msgpack")
    index.apply("a", 1, msgspec.msgpack.encode({"not": "a batch"}))
    mixed = msgspec.msgpack.encode([0.0, [{"type": "BlockMoved", "block_hashes": [1]},
                                          {"type": "BlockStored", "block_hashes": [2], "medium": "GPU"},
                                          {"type": "BlockStored", "block_hashes": "x"}, 7], 0])
    assert index.apply("a", 2, mixed) == APPLIED
    st = index.status("a")
    assert (st.malformed, st.unknown_events, st.next_seq, st.exact) == (2, 3, 3, False)
    assert index.block_hashes("a") == {2}


def test_vllms_own_encoding_bytes_hashes_extra_fields_and_other_groups():
    index = KVIndex()
    events = [VBlockStored(block_hashes=[b"h1", b"h2"], parent_block_hash=None, token_ids=[1, 2], block_size=1,
                           lora_id=None, medium="GPU", lora_name=None, group_idx=0, kv_cache_spec_kind="full",
                           lookahead_token_ids=[[3]]),
              VBlockStored(block_hashes=[b"h9"], parent_block_hash=None, token_ids=[1], block_size=1,
                           lora_id=None, medium="GPU", lora_name=None, group_idx=1),
              VBlockRemoved(block_hashes=[b"h2"], medium="STORAGE", locality="REMOTE")]
    index.apply(7, 0, msgspec.msgpack.encode(VBatch(ts=1.0, events=events)))
    assert index.block_hashes(7) == {b"h1", b"h2"} and index.status(7).other_groups == 1
    assert index.overlap([b"h1", b"h2"]) == {7: 2}


def test_bad_arguments_raise_typed_errors_and_change_nothing():
    index = KVIndex()
    index.apply("a", 0, stored([1]))
    for seq in (-1, 2**64, 1.0, True, "1"):
        with pytest.raises((ArgumentTypeError, ArgumentValueError)):
            index.apply("a", seq, stored([2]))
    with pytest.raises(ArgumentTypeError):
        index.apply("a", 1, "payload")
    with pytest.raises(ArgumentTypeError):
        index.apply(["unhashable"], 0, stored([2]))
    with pytest.raises(ArgumentValueError):
        KVIndex(window=0)
    assert index.status("a").next_seq == 1 and index.block_hashes("a") == {1} and index.instances == ["a"]
    index.check()


from hypothesis import given, strategies as st  # noqa: E402

import radixkv.router.index as index_module  # noqa: E402


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 30), st.booleans(), st.booleans()), max_size=120),
       st.lists(st.integers(0, 30), max_size=40))
def test_runs_equal_a_naive_count_whatever_the_masks(holdings, request_pages):
    """Up to six instances holding random pages on GPU and CPU (often more than 16 distinct masks)."""
    index = KVIndex()
    held = {}
    for i in range(6):
        index.add(i)
    seqs = [0] * 6
    for inst, page, gpu, cpu in holdings:
        for medium, on in (("GPU", gpu), ("CPU", cpu)):
            if on:
                index.apply(inst, seqs[inst], stored([page], medium))
                seqs[inst] += 1
                held.setdefault((inst, page), set()).add(medium)
    g, c = (index.media.index(m) if m in index.media else None for m in (GPU, CPU))
    weights = [0.0] * len(index.media)
    if g is not None:
        weights[g] = 1.0
    if c is not None:
        weights[c] = 0.3
    pages, worth = index.runs(request_pages, weights)
    few, table = index_module._FEW_MASKS, index._table
    try:  # the dict's paths (a handful of masks, or many) give the same answer as the numpy table's
        index._table = None
        for index_module._FEW_MASKS in (few, 0):
            assert index.runs(request_pages, weights) == (pages, worth)
    finally:
        index_module._FEW_MASKS, index._table = few, table
    for inst in range(6):
        n, w = 0, 0.0
        for page in request_pages:
            media = held.get((inst, page))
            if not media:
                break
            n += 1
            w += 1.0 if "GPU" in media else 0.3
        assert pages.get(index.slot(inst), 0) == n
        assert worth.get(index.slot(inst), 0.0) == pytest.approx(w)
    assert index.overlap(request_pages) == {i: pages.get(index.slot(i), 0) for i in range(6)}


def test_the_numpy_table_follows_the_dict_through_growth_tombstones_and_clears():
    import random
    rng = random.Random(5)
    index = KVIndex()
    live = {"a": set(), "b": set()}
    seqs = {"a": 0, "b": 0}
    for step in range(300):
        inst = rng.choice("ab")
        if live[inst] and rng.random() < 0.4:
            gone = rng.sample(sorted(live[inst]), min(len(live[inst]), rng.randrange(1, 50)))
            index.apply(inst, seqs[inst], removed(gone))
            live[inst] -= set(gone)
        elif rng.random() < 0.02:
            index.apply(inst, seqs[inst], encode_batch([AllBlocksCleared()]))
            live[inst] = set()
        else:
            new = [rng.getrandbits(64) or 1 for _ in range(rng.randrange(1, 80))]
            index.apply(inst, seqs[inst], stored(new))
            live[inst] |= set(new)
        seqs[inst] += 1
    assert index._table is not None and len(index._table.keys) > 1024   # grown, still mirroring
    index.check()                                                        # the table equals the dict
    probe = sorted(live["a"])[:20] + [12345]
    assert index.overlap(probe) == {"a": 20 if len(live["a"]) >= 20 else len(live["a"]),
                                   "b": next((i for i, h in enumerate(probe) if h not in live["b"]), len(probe))}


def test_nine_instances_or_bytes_hashes_drop_the_table_and_answer_the_same():
    index = KVIndex()
    for i in range(9):
        index.apply(i, 0, stored(range(1, 20)))
    assert index._table is None and index.overlap(list(range(1, 12))) == {i: 11 for i in range(9)}
    index.check()


def test_a_long_probe_chain_is_read_from_the_dict_and_answers_the_same():
    import numpy as np

    from radixkv.router.table import MaskTable

    table = MaskTable({})
    home = {}
    for k in range(1, 200_000):                      # keys that all start probing at one slot
        home.setdefault(int(table._home(np.array([k], dtype=np.uint64))[0]), []).append(k)
    keys = max(home.values(), key=len)[:12]
    truth = {k: i + 1 for i, k in enumerate(keys)}
    table = MaskTable(truth)
    table.check(truth)
    _, late = table.find(np.array(keys, dtype=np.uint64), rounds=4)
    assert late.size >= 8                             # twelve in one cluster: most still probing after four
    q = np.array(keys + [7], dtype=np.uint64)
    assert table.lookup(q, truth).tolist() == [truth[k] for k in keys] + [0]
