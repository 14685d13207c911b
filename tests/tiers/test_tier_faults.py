"""Faults inside the tier stack cost recomputes, never an exception out of the cache or a broken stack.

A tier whose ``read`` / ``write`` raises, and a remote backend whose ``get`` / ``put`` / ``delete``
raise or answer out of contract (``None``, a short list, wrong types, wrong bytes), fail that one
call: its pages are dropped or missed, counted, warned once; ``check()`` passes and every page
served is the page written for its prefix.
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from radixkv.tiers import LOAD_BACK, WRITE_POLICIES, HostTier, RemoteTier, SimulatedHosts, TieredCache
from radixkv.tiers.base import Copy, checksums

from ..events.test_event_log_faithful import Consumer, nodes_below, residency
from .test_tiers_payload import KV, PS
from .test_tiers_payload import admit_and_verify as serve  # checks every hit page's bytes


HOST_FAULTS = ("write raises", "write answers garbage", "read raises", "read answers garbage",
               "read answers wrong bytes")
BACKEND_FAULTS = ("put raises", "put answers a short list", "put answers wrong types", "put corrupts",
                  "put loses", "put refuses", "get raises", "get answers None", "get answers a short list",
                  "get answers wrong types", "get answers wrong bytes", "get answers nothing",
                  "delete raises", "delete answers garbage")


class FaultyHost(HostTier):
    """A host tier with one injectable fault (``fault``, one of :data:`HOST_FAULTS`, or ``None``)."""

    def __init__(self, num_blocks: int, name: str = "host") -> None:
        super().__init__(num_blocks, name=name)
        self.fault = None

    def write(self, slots, pages):
        if self.fault == "write raises":
            raise RuntimeError("injected: host write")
        ok = super().write(slots, pages)
        return ok[:-1] if self.fault == "write answers garbage" else ok

    def read(self, slots):
        if self.fault == "read raises":
            raise RuntimeError("injected: host read")
        data, ok = super().read(slots)
        if self.fault == "read answers garbage":
            return None, ok
        if self.fault == "read answers wrong bytes" and data is not None and len(data):
            data = data.copy()
            data[0] += 1
        return data, ok


class FaultyHosts(SimulatedHosts):
    """Simulated remote hosts with injectable faults per operation (:data:`BACKEND_FAULTS`)."""

    def __init__(self, num_hosts: int) -> None:
        super().__init__(num_hosts)
        self.faults: dict = {}  # "put" / "get" / "delete" -> the rest of a BACKEND_FAULTS entry

    def put(self, host, slots, values):
        mode = self.faults.get("put")
        if mode == "raises":
            raise RuntimeError("injected: backend put")
        if mode == "corrupts":
            values = [bytes([v[0] ^ 0xFF]) + v[1:] for v in values]
        if mode != "loses":
            super().put(host, slots, values)
        return {"answers a short list": [True] * (len(slots) - 1), "answers wrong types": ["stored"] * len(slots),
                "refuses": [False] * len(slots)}.get(mode)

    def get(self, host, slots):
        mode = self.faults.get("get")
        if mode == "raises":
            raise RuntimeError("injected: backend get")
        values = super().get(host, slots)
        if mode == "answers wrong bytes":
            return [None if v is None else bytes(b ^ 0x55 for b in v) for v in values]
        return {"answers None": None, "answers a short list": values[:-1], "answers wrong types": [1] * len(values),
                "answers nothing": [None] * len(values)}.get(mode, values)

    def delete(self, host, slots):
        mode = self.faults.get("delete")
        if mode == "raises":
            raise RuntimeError("injected: backend delete")
        super().delete(host, slots)
        return 42 if mode == "answers garbage" else None


def test_a_tier_write_raising_during_a_cascade_drops_the_pages_and_leaves_the_stack_whole():
    host, lower = HostTier(2), FaultyHost(8, name="remote")
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[host, lower], load_back="always")
    serve(cache, [1, 1, 2, 2])
    serve(cache, [3, 3, 4, 4])          # [1,1,2,2] demoted to the host
    lower.fault = "write raises"
    with pytest.warns(RuntimeWarning, match="write failed"):
        serve(cache, [5, 5, 6, 6])      # the host cascades [1,1,2,2] down: that write raises
    cache.check()
    stats = cache.tier_stats()
    assert stats.tier_errors == 1 and stats.dropped_pages == 2
    assert stats.pages_by_tier == {"host": 2, "remote": 0}
    lower.fault = None
    assert serve(cache, [1, 1, 2, 2]) == 0  # dropped: recomputed, not served from anywhere
    assert serve(cache, [3, 3, 4, 4]) == 2 * PS  # the host's pages still serve
    cache.check()


def test_a_tier_read_raising_on_load_is_a_counted_miss():
    host = FaultyHost(4)
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[host], load_back="always")
    serve(cache, [1, 1, 2, 2])
    serve(cache, [3, 3, 4, 4])
    host.fault = "read raises"
    with pytest.warns(RuntimeWarning, match="read failed"):
        assert serve(cache, [1, 1, 2, 2]) == 0
    cache.check()
    assert cache.tier_stats().tier_errors == 1 and cache.tier_stats().integrity_misses == 2


@pytest.mark.parametrize("fault", ["get answers None", "get answers a short list", "get answers wrong types",
                                   "put answers a short list", "put answers wrong types"])
def test_a_backend_answering_out_of_contract_is_a_counted_backend_error(fault):
    backend = FaultyHosts(1)
    tier = RemoteTier(8, backend=backend)
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[tier], load_back="always")
    serve(cache, [1, 2, 3, 4])
    op, mode = fault.split(" ", 1)
    backend.faults[op] = mode
    with pytest.warns(RuntimeWarning, match=f"backend {op}"):
        serve(cache, [5, 6, 7, 8])      # demotes [1,2,3,4]: a put
        served = serve(cache, [1, 2, 3, 4])  # loads it back: a get
    cache.check()
    assert served == 0 and tier.backend_errors >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # later failures are counted, not warned again
        serve(cache, [9, 9, 9, 9])
        serve(cache, [5, 6, 7, 8])
    cache.check()


def test_a_backend_returning_wrong_bytes_is_an_integrity_miss():
    backend = FaultyHosts(1)
    cache = TieredCache(2, page_size=PS, kv_shape=KV, tiers=[RemoteTier(8, backend=backend)], load_back="always")
    serve(cache, [1, 2, 3, 4])
    serve(cache, [5, 6, 7, 8])
    backend.faults["get"] = "answers wrong bytes"
    assert serve(cache, [1, 2, 3, 4]) == 0
    assert cache.tier_stats().integrity_misses == 2
    cache.check()


# ---------------------------------------------------------------------------------------------
# The class: a state machine that injects a fault at any step, anywhere below HBM.

def ns_page(namespace, tokens, i: int) -> np.ndarray:
    """The payload of page ``i`` of ``tokens`` in ``namespace``: a function of both, through that page."""
    prefix = repr(namespace).encode() + np.asarray(tokens[: (i + 1) * PS], dtype=np.uint32).tobytes()
    seed = zlib.crc32(prefix)
    return (np.arange(PS * KV[0], dtype=np.float32).reshape(PS, *KV) + seed % 9973).astype(np.float16)


class ModelError(Exception):
    """What an engine's model raises mid forward pass (an OOM, a cancelled request)."""


tokens_st = st.lists(st.integers(0, 2), min_size=PS, max_size=10)
fault_st = st.none() | st.sampled_from(("heal",) + HOST_FAULTS + BACKEND_FAULTS)
namespace_st = st.sampled_from([None, "tenant-b"])


class TierFaultMachine(RuleBasedStateMachine):
    """HBM over a host tier over two simulated remote hosts, payloads on, events on; faults at any step.

    Every rule calls the public API and none of these calls may raise (a fault below HBM costs
    recomputes only). After every step: ``check()``, no block held or protected, every page in
    every tier holds (or, below HBM, is checksummed as) the bytes written for its prefix, the
    faults were warned once per counter, and a consumer applying every event holds exactly what
    every tier holds.
    """

    sequences = Bundle("sequences")

    def __init__(self) -> None:
        super().__init__()
        self._warnings = warnings.catch_warnings(record=True)
        self.caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        self.cache = None

    @initialize(write_policy=st.sampled_from(WRITE_POLICIES), load_back=st.sampled_from(LOAD_BACK),
                sizes=st.tuples(st.integers(2, 4), st.integers(1, 3), st.integers(1, 3)),
                threshold=st.integers(1, 2))
    def build(self, write_policy, load_back, sizes, threshold):
        hbm, host, remote = sizes
        self.host = FaultyHost(host)
        self.backend = FaultyHosts(2)
        self.remote = RemoteTier(remote, backend=self.backend)
        self.cache = TieredCache(hbm, PS, kv_shape=KV, tiers=[self.host, self.remote], write_policy=write_policy,
                                 load_back=load_back, write_through_threshold=threshold, enable_events=True)
        self.consumer = Consumer()
        self.stack_faulted = False

    # -- faults: drawn with each request; each stays until healed, one per operation at a time
    def _fault(self, fault) -> None:
        if fault == "heal":
            self.host.fault = None
            self.backend.faults = {}
        elif fault in HOST_FAULTS:
            self.host.fault = fault
        elif fault is not None:
            op, mode = fault.split(" ", 1)
            self.backend.faults[op] = mode

    # -- requests
    def _verify(self, tokens, namespace, blocks) -> None:
        got = self.cache.read(blocks) if len(blocks) else []
        for i in range(len(blocks)):
            assert np.array_equal(got[i], ns_page(namespace, tokens, i)), f"page {i} of {tokens} served wrong bytes"

    def _write(self, tokens, namespace, first: int, blocks) -> None:
        """The model's forward pass: the KV of pages ``first..`` of ``tokens`` into ``blocks``."""
        if len(blocks):
            self.cache.write(blocks, np.stack([ns_page(namespace, tokens, first + j) for j in range(len(blocks))]))

    @rule(target=sequences, tokens=tokens_st, namespace=namespace_st)
    def sequence(self, tokens, namespace):
        return tokens, namespace

    @rule(target=sequences, seq=sequences, tokens=tokens_st)
    def extended(self, seq, tokens):
        return seq[0][: len(seq[0]) // PS * PS] + tokens, seq[1]  # shares a prefix with ``seq``

    @rule(seq=sequences, fault=fault_st)
    def admit(self, seq, fault):
        self._fault(fault)
        tokens, namespace = seq
        a = self.cache.admit(tokens, namespace=namespace)
        hit = a.hit_tokens // PS
        self._verify(tokens, namespace, a.blocks[:hit])
        self._write(tokens, namespace, hit, a.new_blocks)
        a.release()

    # -- the model raises between admit and release: ``with cache.admit(...)`` aborts, uncaching
    # the admission's new pages (and what a batch mate cached below them); the invariants then
    # hold as after any step: no tier and no event keeps a page whose KV was never written.
    @rule(seq=sequences, mate=st.none() | sequences, fault=fault_st, scribble=st.booleans())
    def model_raises(self, seq, mate, fault, scribble):
        self._fault(fault)
        tokens, namespace = seq
        batch_mate = None
        with pytest.raises(ModelError):
            with self.cache.admit(tokens, namespace=namespace) as a:
                hit = a.hit_tokens // PS
                self._verify(tokens, namespace, a.blocks[:hit])
                if scribble and len(a.new_blocks):  # a partial forward pass left bytes of no prefix
                    self.cache.write(a.new_blocks, np.full((len(a.new_blocks), PS, *KV), 7, np.float16))
                if mate is not None:  # admitted in the same batch: it may continue a's new pages
                    batch_mate = (mate, self.cache.admit(mate[0], namespace=mate[1]))
                raise ModelError("the forward pass failed")
        if batch_mate is not None:  # the batch mate's own forward pass completes after a's abort
            (m_tokens, m_namespace), b = batch_mate
            self._write(m_tokens, m_namespace, b.hit_tokens // PS, b.new_blocks)
            b.release()

    @rule(seq=sequences, fault=fault_st)
    def match_and_insert(self, seq, fault):
        self._fault(fault)
        tokens, namespace = seq
        m = self.cache.match(tokens, namespace=namespace)
        hit = m.num_tokens // PS
        self._verify(tokens, namespace, m.blocks)
        need = len(tokens) // PS - hit
        self.cache.lock(m.node)
        try:
            new = self.cache.allocate(need)
            if new is not None and need:
                self.cache.write(new, np.stack([ns_page(namespace, tokens, hit + j) for j in range(need)]))
                self.cache.insert(tokens, np.concatenate([m.blocks, new]), namespace=namespace)
        finally:
            self.cache.unlock(m.node)

    @rule(action=st.integers(0, 19))
    def evict_reset_or_kill(self, action):
        """Mostly an eviction of 1-4 blocks; 1 in 20 a reset, 1 in 20 remote host 0 dies."""
        if action == 19:
            self.stack_faulted |= self.cache._stack.tier_errors > 0  # reset zeroes the counters
            self.cache.reset()
        elif action == 18:
            self.backend.kill(0)
        else:
            self.cache.evict(action % 4 + 1)

    # -- an event sink that raises: the events are a list the caller takes (take_events); a
    # publisher seam that calls out belongs here when there is one.

    # -- invariants
    @invariant()
    def consistent(self):
        cache = self.cache
        if cache is None:
            return
        cache.check()
        assert cache.num_held_blocks == 0 and cache.protected_blocks == 0
        self._check_bytes()
        self._check_warned_once()
        self.consumer.apply(cache.take_events())
        assert self.consumer.view() == residency(cache)

    def _check_bytes(self) -> None:
        cache = self.cache
        namespace_of = {id(root): ns for ns, root in cache._tree.roots()}
        for ns, root in cache._tree.roots():
            for node, tokens in nodes_below(root, cache._tree.page_bytes):
                got = cache.read(node.blocks)
                for i in range(node.num_pages):
                    assert np.array_equal(got[i], ns_page(ns, tokens, node.start + i)), "HBM holds wrong bytes"
        for key, root in cache._stack.tree.roots():
            ns = namespace_of[id(key)]
            for node, tokens in nodes_below(root, cache._tree.page_bytes):
                copy = node.ext
                if not isinstance(copy, Copy):
                    continue
                want = np.stack([ns_page(ns, tokens, node.start + i) for i in range(node.num_pages)])
                assert np.array_equal(copy.sums, checksums(want)), "a lower copy's checksum is not its prefix's"
                for i, slot in enumerate(copy.slots.tolist()):
                    if copy.tier is self.host:
                        assert np.array_equal(self.host.data[slot], want[i]), "the host holds wrong bytes"
                        continue
                    host, local = divmod(slot, self.remote.blocks_per_host)
                    raw = self.backend.stores[host].get(local)
                    if raw is not None and raw != want[i].tobytes():  # then it must fail its checksum
                        assert zlib.crc32(raw) != int(copy.sums[i]), "wrong remote bytes pass the checksum"

    def _check_warned_once(self) -> None:
        said = [str(w.message) for w in self.caught if issubclass(w.category, RuntimeWarning)]
        stack_said = sum("TierStack.tier_errors" in m for m in said)
        remote_said = sum("RemoteTier.backend_errors" in m for m in said)
        self.stack_faulted |= self.cache._stack.tier_errors > 0
        assert stack_said == int(self.stack_faulted)
        assert remote_said == min(1, self.remote.backend_errors)

    def teardown(self):
        self._warnings.__exit__(None, None, None)
        if self.cache is not None:
            self.cache.check()


TierFaultMachine.TestCase.settings = settings(stateful_step_count=40, deadline=None)
test_tier_faults_state_machine = TierFaultMachine.TestCase


def test_a_failed_load_back_in_an_otherwise_empty_namespace_keeps_its_root():
    """The lower tier loses the namespace's only page on a failed read during admit: the root the
    admission hangs its new pages under must stay registered (check() recounted 0 of 1 cached)."""
    machine = TierFaultMachine()
    machine.build(write_policy="write_back", load_back="cost", sizes=(2, 1, 1), threshold=1)
    seq = machine.sequence(namespace=None, tokens=[0, 0])
    machine.admit(fault=None, seq=seq)
    machine.evict_reset_or_kill(action=0)
    machine.consistent()
    machine.admit(fault="read raises", seq=seq)
    machine.consistent()
    assert machine.cache.num_cached_blocks == 1
