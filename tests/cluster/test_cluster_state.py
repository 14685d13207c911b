"""The cluster ledger as a state machine: requests, borrowing, recalls and creditor failures,
with and without the cluster-wide page index (pages pulled from peers) and a shared page store
(bounded or not, going down and coming back).

Creditors fail two ways: they stop answering (refuse every loan) and come back, or crash
(lose their memory and restart empty).

After every step: every instance's ``check()`` and the ledger's (``Cluster.check``, which
includes no stranded copy and, with the index, that it equals the union of every instance's
HBM pages and of its host-tier pages), the ledger equals the blocks each creditor holds for others,
and every page anywhere (HBM, borrowed memory, host) holds the bytes written for its prefix.
Every hit, and every page pulled from a peer (from its HBM or its host tier), is verified byte for
byte when it is served. Without borrowing, HBM spills straight to the host tier, so host copies,
host-tier evictions and load-backs are frequent.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixkv import LockError
from radixkv.cluster import ROUTING, Cluster
from radixkv.keys import TOKEN_DTYPE
from radixkv.tiers.base import Copy
from radixkv.tree import Node

PS = 2
KV = (3,)
pytestmark = pytest.mark.filterwarnings("ignore:page store:RuntimeWarning")  # its outages count, not warn
NAMESPACES = (None, "tenant-b")


def page_value(namespace, tokens, page: int) -> np.ndarray:
    """The payload of page ``page``: a function of the namespace and the whole prefix through it."""
    prefix = np.asarray(tokens[: (page + 1) * PS], dtype=TOKEN_DTYPE).tobytes()
    seed = zlib.crc32(prefix, zlib.crc32(repr(namespace).encode())) % (1 << 20)
    return (np.arange(PS * KV[0], dtype=np.float32).reshape(PS, *KV) + seed * 8).astype(np.float32)


def prefix_of(cache, node: Node):
    """``(namespace, tokens from the root through node)`` of an HBM or spill-tree node."""
    root, data = cache._path_data(node)
    keys = {id(r): ns for ns, r in cache._tree.roots()}
    tokens = np.frombuffer(data, dtype=TOKEN_DTYPE).tolist()
    if id(root) not in keys:  # a spill-tree root: filed under its HBM root (or its namespace)
        key = next(k for k, r in cache._stack.tree.roots() if r is root)
        if not isinstance(key, Node):
            return key, tokens
        root = key
    return keys[id(root)], tokens


class ClusterMachine(RuleBasedStateMachine):
    sequences = Bundle("sequences")

    @initialize(routing=st.sampled_from(ROUTING), host_blocks=st.sampled_from([0, 0, 0, 4, 4, 6]),
                num_blocks=st.sampled_from([3, 4, 6]), lend_cap=st.sampled_from([0.5, 0.5, 1.0]),
                low_watermark=st.sampled_from([0.0, 0.2]), global_index=st.booleans(),
                store=st.sampled_from([None, "memory"]), store_blocks=st.sampled_from([None, 4]),
                borrowing=st.sampled_from([True, True, False]), duplicates=st.sampled_from(["move", "copy"]))
    def setup(self, routing, host_blocks, num_blocks, lend_cap, low_watermark, global_index, store, store_blocks,
              borrowing, duplicates):
        self.cluster = Cluster(3, num_blocks, PS, routing=routing, borrowing=borrowing, host_blocks=host_blocks,
                               lend_cap=lend_cap, low_watermark=low_watermark, kv_shape=KV, dtype="float32",
                               global_index=global_index, store=store,
                               store_blocks=store_blocks if store else None, duplicates=duplicates)
        self.open = []  # (instance, admission) not released yet
        self.written = set()  # (namespace, prefix) of every page whose KV was written

    # -------------------------------------------------------------- helpers
    def _verify_hit(self, i, namespace, tokens, admission):
        pages = admission.hit_tokens // PS
        if not pages:
            return
        got = self.cluster.instances[i].cache.read(admission.blocks[:pages])
        for p in range(pages):
            assert (namespace, tuple(tokens[: (p + 1) * PS])) in self.written, "hit on a page never written"
            np.testing.assert_array_equal(got[p], page_value(namespace, tokens, p),
                                          err_msg=f"page {p} of {tokens} in {namespace!r}: wrong bytes")

    def _admit(self, tokens, ns_index, at):
        cluster = self.cluster
        namespace = NAMESPACES[ns_index]
        if cluster.routing == "round_robin":
            cluster._next = at  # requests to a chosen instance, through the real routing path
        i, admission = cluster.admit(tokens, namespace=namespace)
        self._verify_hit(i, namespace, tokens, admission)
        start = admission.hit_tokens // PS
        pulled = cluster.last_pull.pages
        if pulled:  # copied from a peer through the index: written pages, with their own bytes
            event("pulled from a peer")
            assert cluster.index is not None and cluster.last_pull.source != i
            assert 0 <= cluster.last_pull.host_pages <= pulled
            if cluster.last_pull.host_pages:
                event("pulled from a peer's host tier")
            got = cluster.instances[i].cache.read(admission.new_blocks[:pulled])
            for p in range(pulled):
                assert (namespace, tuple(tokens[: (start + p + 1) * PS])) in self.written, "pulled an unwritten page"
                np.testing.assert_array_equal(got[p], page_value(namespace, tokens, start + p),
                                              err_msg=f"pulled page {start + p} of {tokens}: wrong bytes")
            start += pulled
        new = admission.new_blocks[pulled:]
        if len(new):
            cluster.instances[i].cache.write(
                new, np.stack([page_value(namespace, tokens, start + j) for j in range(len(new))]))
            self.written.update((namespace, tuple(tokens[: (start + j + 1) * PS])) for j in range(len(new)))
        return i, admission

    # -------------------------------------------------------------- rules
    @rule(target=sequences, tokens=st.lists(st.integers(0, 2), min_size=PS, max_size=12))
    def new_sequence(self, tokens):
        return tokens

    @rule(target=sequences, base=sequences, extra=st.lists(st.integers(0, 2), min_size=PS, max_size=6))
    def extend(self, base, extra):
        return base + extra

    @rule(tokens=sequences, ns_index=st.integers(0, 1), at=st.integers(0, 2))
    def request(self, tokens, ns_index, at):
        self._admit(tokens, ns_index, at)[1].release()

    @precondition(lambda self: len(self.open) < 2)
    @rule(tokens=sequences, ns_index=st.integers(0, 1), at=st.integers(0, 2))
    def open_request(self, tokens, ns_index, at):
        self.open.append(self._admit(tokens, ns_index, at))

    @precondition(lambda self: self.open)
    @rule(index=st.integers(0, 1))
    def release(self, index):
        self.open.pop(index % len(self.open))[1].release()

    @rule(i=st.integers(0, 2), n=st.integers(1, 4))
    def evict(self, i, n):
        """Instance ``i`` makes room one page at a time: each spills into borrowed memory (or the host)
        on its own, so a chain's pages may end up lent by different creditors."""
        for _ in range(n):
            self.cluster.instances[i].cache.evict(1)
            self.cluster.manager.heartbeat(i)

    @rule(i=st.integers(0, 2))
    def spill_all(self, i):
        """Instance ``i`` evicts every page it can (to borrowed memory or its host tier, or dropped):
        what a peer needs of it is then below its HBM."""
        cache = self.cluster.instances[i].cache
        cache.evict(cache.num_cached_blocks)
        self.cluster.manager.heartbeat(i)

    @precondition(lambda self: self.cluster.manager.debt.any())
    @rule(pick=st.integers(0, 2), n=st.integers(1, 4))
    def recall(self, pick, n):
        m = self.cluster.manager
        lenders = [c for c in range(3) if m.lent(c)]
        creditor = lenders[pick % len(lenders)]
        lent = m.lent(creditor)
        freed = m.recall(creditor, n)
        assert freed >= min(n, lent), f"recall of {n} from {creditor} freed {freed} of {lent}"

    @precondition(lambda self: self.cluster.store_url is not None)
    @rule(up=st.booleans())
    def store_outage(self, up):
        """The shared store goes down (every call a counted miss, nothing raised) or comes back."""
        self.cluster.instances[0].cache.store.backend.available = up

    @rule(i=st.integers(0, 2), available=st.booleans())
    def set_available(self, i, available):
        """A creditor stops answering (it refuses every loan) or comes back."""
        self.cluster.instances[i].available = available

    @rule(pick=st.integers(0, 2))
    def crash(self, pick):
        """An instance (a lender, if any) loses its memory: its debtors forget what it held, it restarts empty."""
        cluster = self.cluster
        lenders = [c for c in range(3) if cluster.manager.lent(c)] or [0, 1, 2]
        i = lenders[pick % len(lenders)]
        try:
            cluster.crash(i)
        except LockError:
            assert any(j == i for j, _ in self.open), "crash refused with no admission open"
            return
        m = cluster.manager
        assert m.lent(i) == 0 and m.owed(i) == 0
        assert cluster.instances[i].cache.num_free_blocks == cluster.instances[i].cache.num_blocks

    # -------------------------------------------------------------- invariants
    @invariant()
    def ledger_is_exact(self):
        self.cluster.check()
        m = self.cluster.manager
        for inst in self.cluster.instances:
            i = inst.index
            # a creditor's blocks outside its tree are exactly the ones it lends (nothing else holds any)
            assert inst.cache.num_held_blocks == m.lent(i) == int(m.debt[:, i].sum())
            assert (inst.borrowed.used if inst.borrowed is not None else 0) == m.owed(i) == int(m.debt[i].sum())
            assert m.debt[i, i] == 0
        assert m.blocks_lent >= int(m.debt.sum())

    @invariant()
    def every_page_holds_its_bytes(self):
        """Every page in HBM and every lower copy (borrowed blocks included) holds its prefix's KV."""
        for inst in self.cluster.instances:
            cache = inst.cache
            pages = [(node, cache.read(node.blocks)) for node in cache._tree.nodes()]
            for node in cache._stack.tree.nodes():
                if isinstance(node.ext, Copy):
                    data, ok = node.ext.tier.read(node.ext.slots)
                    assert ok.all(), f"instance {inst.index}: {node} lost its payload"
                    pages.append((node, data))
            for node, data in pages:
                namespace, tokens = prefix_of(cache, node)
                want = [page_value(namespace, tokens, node.start + k) for k in range(node.num_pages)]
                assert np.array_equal(data, want), f"instance {inst.index}: {node} holds wrong bytes"

    def teardown(self):
        for _, admission in self.open:
            admission.release()
        if hasattr(self, "cluster"):
            self.cluster.check()


class HostIndexMachine(ClusterMachine):
    """The same machine with the cluster-wide index always on over host tiers, mostly without
    borrowing (HBM spills straight to the host): pulls from a peer's host tier, host-tier
    evictions and load-backs on every run, with the index recounted from HBM and host each step."""

    @initialize(routing=st.sampled_from(("round_robin", "round_robin", *ROUTING)), host_blocks=st.sampled_from([3, 4, 6]),
                num_blocks=st.sampled_from([3, 4]), borrowing=st.sampled_from([False, False, True]),
                duplicates=st.sampled_from(["move", "copy"]), store=st.sampled_from([None, None, "memory"]))
    def setup(self, routing, host_blocks, num_blocks, borrowing, duplicates, store):
        self.cluster = Cluster(3, num_blocks, PS, routing=routing, borrowing=borrowing, host_blocks=host_blocks,
                               kv_shape=KV, dtype="float32", global_index=True, store=store, duplicates=duplicates)
        self.open = []
        self.written = set()

    @rule(tokens=ClusterMachine.sequences, ns_index=st.integers(0, 1), at=st.integers(0, 2), to=st.integers(1, 2))
    def served_then_spilled_then_served_elsewhere(self, tokens, ns_index, at, to):
        """Instance ``at`` serves ``tokens`` and spills everything, then another serves them (under round
        robin: the instance chosen; else where the routing sends it): a pull from a host tier if
        the other holds less of them."""
        self._admit(tokens, ns_index, at)[1].release()
        self.spill_all(at)
        self.cluster.check()
        self._admit(tokens, ns_index, (at + to) % 3)[1].release()


for machine in (ClusterMachine, HostIndexMachine):
    machine.TestCase.settings = settings(
        max_examples=600 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 60,
        stateful_step_count=40, deadline=None)
TestClusterMachine = ClusterMachine.TestCase
TestHostIndexMachine = HostIndexMachine.TestCase
