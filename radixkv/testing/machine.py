"""The conformance state machine: drive any prefix cache, compare it with a page-set model.

The model is the set of cached pages (``{(namespace, tokens): block}``), the
locks the machine holds and the blocks its open requests hold. Every rule
calls the cache, then reads ``contents()`` and checks that the change is one
the contract allows (:class:`~radixkv.testing.protocol.PrefixCacheUnderTest`):
a match changes nothing, an insert adds only the pages it was given, evictions
drop only unprotected pages and as many as asked, blocks are never shared.
Eviction *order* is left to the cache's policy; everything else is pinned.

Requests are driven as engines drive them: several open at once (matched,
locked, blocks allocated and held across steps), growing by decode, then
finished (inserted) or aborted (blocks freed uninserted); sequences include
strict prefixes of each other and requests churn through extra namespaces.

>>> from radixkv import PrefixCache
>>> from radixkv.testing import RadixKVTarget, run_conformance
>>> run_conformance(lambda: RadixKVTarget(PrefixCache(num_blocks=6, page_size=2)),
...                 max_examples=5)
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import (Any, Callable, Collection, Dict, Hashable, List, Mapping, Optional, Sequence, Set, Tuple,
                    Type, Union)

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from .protocol import PageKey, PrefixCacheUnderTest, longest_cached
from .strategies import shared_prefix_pairs, token_lists

Factory = Callable[[], PrefixCacheUnderTest]
MAX_OPEN_REQUESTS = 3


@dataclass(frozen=True)
class Target:
    """A cache factory plus the :func:`make_state_machine` options its semantics need.

    ``name`` keys hypothesis's example database, so a failure saved from one
    target is never replayed against another; give each distinct cache
    configuration its own name.
    """

    factory: Factory
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> PrefixCacheUnderTest:
        return self.factory()


@dataclass
class _Request:
    """A request the machine holds open: its matched (locked) prefix and the blocks it allocated."""

    tokens: List[int]
    namespace: Optional[Hashable]
    node: Any
    passed: List[int]  # one block per full page so far: the hit's blocks (unless fresh), then allocated
    allocated: List[int]  # the blocks this request holds (allocated, not yet inserted or freed)
    lock: Tuple[Any, Optional[Hashable], Tuple[int, ...]]  # its entry in the machine's locks


def make_state_machine(
    factory: Union[Factory, Target],
    *,
    namespaces: Sequence[Optional[Hashable]] = (None, "a"),
    alphabet: int = 3,
    max_pages: int = 4,
    exact_eviction: bool = True,
    admits_everything: bool = False,
    loads_on_match: bool = False,
    over_eviction: bool = False,
    max_hit: Optional[Callable[[int], int]] = None,
    lazy_eviction: bool = False,
    shared_root: bool = False,
    reserved_blocks: Collection[int] = (),
    unlock_raises: bool = True,
    churn_namespaces: int = 3,
    prefix_closed: bool = True,
) -> Type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` class that checks the cache ``factory()`` builds.

    Args:
        factory: builds a fresh cache for each test case; a :class:`Target`'s
            options are defaults that keyword arguments here override (those
            that differ from this function's defaults; :func:`run_conformance` overrides with any).
        namespaces: namespaces requests are drawn from.
        alphabet: distinct token values (small = more shared prefixes).
        max_pages: longest sequence, in pages (plus up to a page of tail).
        exact_eviction: require ``evict(n)`` to drop ``min(n, unprotected pages)``
            (at least that many with ``over_eviction``); turn off for caches that may stop early.
        admits_everything: require ``insert`` to cache every new page
            (turn off for policies with admission control).
        loads_on_match: the cache has lower tiers that ``match`` loads pages
            back from (:class:`~radixkv.tiers.TieredCache`): a match may then
            return more pages than ``contents()`` held, provided they appear in
            ``contents()`` with the returned blocks (evicting at most as many).
        over_eviction: eviction drops whole nodes, so ``evict(n)`` and
            ``allocate(n)`` may drop more than ``n`` unprotected pages (SGLang
            evicts whole leaves until at least ``n`` tokens are free).
        max_hit: the longest hit, in tokens, for a prompt of ``n`` tokens: a
            match returns the cached prefix cut to ``max_hit(n) // page_size``
            pages (SGLang and vLLM always recompute the last prompt token:
            ``lambda n: n - 1``).
        lazy_eviction: the cache has no "evict ``n`` now"; pages go only when
            ``allocate`` reuses their blocks, and ``evict`` is never called (vLLM).
        shared_root: one root handle serves every namespace, so an empty
            match's handle is locked by any namespace's empty match (SGLang).
        reserved_blocks: block ids the cache never hands out; ids then run over
            ``range(num_blocks + len(reserved_blocks))`` minus these (block 0 in SGLang and vLLM).
        unlock_raises: ``unlock`` of a handle holding no lock raises ``ValueError``;
            turn off for caches that trust their caller (SGLang, vLLM): that rule is then not run.
        churn_namespaces: extra namespaces (``"churn-0"``, ...) that requests
            cycle through, so pages of many namespaces compete for blocks; 0 turns it off.
        prefix_closed: what stays cached is prefix-closed (a page's predecessor is
            cached too); turn off for caches whose eviction may drop a page before
            its successors, leaving them unreachable (vLLM's free queue).

    The optional cache member ``free(blocks)`` (return held blocks never
    inserted) turns on the abort rule. Use ``make_state_machine(...).TestCase``
    as a unittest/pytest test class, or :func:`run_conformance`.
    """
    if isinstance(factory, Target):
        return make_state_machine(factory.factory, **{**dict(factory.options), **_given(locals())})
    namespace_choices = list(namespaces)
    churn_choices = [f"churn-{i}" for i in range(churn_namespaces)] or namespace_choices
    reserved = frozenset(int(b) for b in reserved_blocks)

    class PrefixCacheMachine(RuleBasedStateMachine):
        sequences = Bundle("sequences")

        def __init__(self) -> None:
            super().__init__()
            self.cache = factory()
            self.page_size = int(self.cache.page_size)
            self.num_blocks = int(self.cache.num_blocks)
            self.block_ids = frozenset(range(self.num_blocks + len(reserved))) - reserved
            self.model: Dict[PageKey, int] = dict(self.cache.contents())
            self.locks: List[Tuple[Any, Optional[Hashable], Tuple[int, ...]]] = []
            self.requests: List[_Request] = []
            self.max_len = max_pages * self.page_size + self.page_size - 1

        # -------------------------------------------------------- model helpers
        def _longest(self, tokens: Sequence[int], namespace: Optional[Hashable]) -> List[int]:
            return longest_cached(self.model, tokens, self.page_size, namespace)

        def _hit(self, tokens: Sequence[int], namespace: Optional[Hashable]) -> List[int]:
            """The blocks a match of ``tokens`` must return: the cached run, cut by ``max_hit``."""
            blocks = self._longest(tokens, namespace)
            if max_hit is not None:
                blocks = blocks[: max(0, max_hit(len(tokens))) // self.page_size]
            return blocks

        def _protected(self) -> Set[PageKey]:
            p = self.page_size
            out: Set[PageKey] = set()
            for _, namespace, prefix in self.locks:
                for end in range(p, len(prefix) + 1, p):
                    out.add((namespace, prefix[:end]))
            return out

        def _held(self) -> Set[int]:
            return {b for r in self.requests for b in r.allocated}

        def _room(self) -> int:
            """Blocks an allocate can still have: neither held nor holding a protected page."""
            return self.num_blocks - len(self._held()) - len(self._protected().intersection(self.model))

        def _observe(self, what: str, *, max_dropped: int = 0, exact_dropped: Optional[int] = None,
                     added: Optional[Dict[PageKey, int]] = None) -> int:
            """Read contents(), check the change since the model, adopt it; return pages dropped."""
            new = dict(self.cache.contents())
            old = self.model
            for key, block in new.items():
                if key in old and old[key] != block:
                    raise AssertionError(f"{what}: page {key} moved from block {old[key]} to {block}")
            dropped = [key for key in old if key not in new]
            appeared = {key: new[key] for key in new if key not in old}
            allowed = added or {}
            unexpected = {k: v for k, v in appeared.items() if allowed.get(k) != v}
            assert not unexpected, f"{what}: pages appeared that were not inserted: {unexpected}"
            lost = self._protected().intersection(dropped)
            assert not lost, f"{what}: locked pages were dropped: {sorted(lost, key=str)}"
            taken = self._held().intersection(new.values())
            assert not taken, f"{what}: blocks held by open requests hold cached pages: {sorted(taken)}"
            if exact_dropped is not None:
                assert len(dropped) == exact_dropped, (
                    f"{what}: dropped {len(dropped)} pages, expected {exact_dropped}")
            else:
                assert len(dropped) <= max_dropped, (
                    f"{what}: dropped {len(dropped)} pages, at most {max_dropped} allowed")
            self.model = new
            return len(dropped)

        def _match(self, tokens: List[int], namespace: Optional[Hashable]):
            p = self.page_size
            expected = self._hit(tokens, namespace)
            m = self.cache.match(tokens, namespace=namespace)
            got = [int(b) for b in m.blocks]
            loaded = got[len(expected):] if loads_on_match and got[: len(expected)] == expected else []
            assert m.num_tokens == len(got) * p and got == expected + loaded, (
                f"match({tokens}, namespace={namespace!r}) returned {m.num_tokens} tokens in "
                f"blocks {got}; cached pages say {len(expected) * p} tokens in {expected}")
            added = {(namespace, tuple(tokens[: (len(expected) + i + 1) * p])): b for i, b in enumerate(loaded)}
            self._observe("match", max_dropped=len(loaded), added=added)
            for key in added:
                assert key in self.model, f"match returned page {key} loaded back but not cached"
            return m

        def _allocate(self, need: int) -> Optional[List[int]]:
            """``allocate(need)`` checked against the model; ``None`` when the cache had no room."""
            room = self._room()
            held = self._held()
            blocks = self.cache.allocate(need)
            if blocks is None:
                assert need > room, f"allocate({need}) returned None with {room} blocks free or unprotected"
                self._observe("failed allocate")
                return None
            blocks = [int(b) for b in blocks]
            assert len(blocks) == need, f"allocate({need}) returned {len(blocks)} blocks"
            assert len(set(blocks)) == need, f"allocate({need}) returned duplicates: {blocks}"
            assert self.block_ids.issuperset(blocks), f"allocate returned ids outside the pool: {blocks}"
            again = held.intersection(blocks)
            assert not again, f"allocate({need}) returned blocks open requests still hold: {sorted(again)}"
            self._observe(f"allocate({need})", max_dropped=len(self.model) if over_eviction else need)
            reused = set(self.model.values()).intersection(blocks)
            assert not reused, f"allocate({need}) returned blocks still cached: {sorted(reused)}"
            return blocks

        def _open(self, tokens: List[int], namespace: Optional[Hashable], fresh: bool) -> Optional[_Request]:
            """Match, lock the hit, allocate blocks for the rest (all pages if ``fresh``)."""
            m = self._match(tokens, namespace)
            entry = self._lock(m, namespace, tokens)
            hit = [] if fresh else [int(b) for b in m.blocks]
            req = _Request(list(tokens), namespace, m.node, hit, [], entry)
            if not self._grow(req):
                self._close(req)
                return None
            return req

        def _grow(self, req: _Request) -> bool:
            """Allocate blocks for the request's full pages that have none yet; False if there was no room."""
            need = len(req.tokens) // self.page_size - len(req.passed)
            if need <= 0:
                return True
            self.requests.append(req)  # its blocks count as held while allocating more
            try:
                blocks = self._allocate(need)
            finally:
                self.requests.remove(req)
            if blocks is None:
                return False
            req.passed += blocks
            req.allocated += blocks
            return True

        def _close(self, req: _Request) -> None:
            """Drop the request's lock (its blocks were inserted or freed)."""
            del self.locks[next(i for i, e in enumerate(self.locks) if e is req.lock)]
            self.cache.unlock(req.node)
            self._observe("unlock")

        def _finish(self, req: _Request) -> None:
            """Insert the request's pages with its blocks, check what the cache kept, unlock."""
            p = self.page_size
            tokens, namespace, passed = req.tokens, req.namespace, req.passed
            num_pages = len(tokens) // p
            expected_present = len(self._longest(tokens, namespace))
            present = self.cache.insert(tokens, passed, namespace=namespace)
            assert present == expected_present, (
                f"insert returned {present} pages already cached, expected {expected_present}")
            req.allocated = []
            offered = {(namespace, tuple(tokens[: (i + 1) * p])): passed[i] for i in range(present, num_pages)}
            self._observe("insert", added=offered)
            kept = [i for i in range(present, num_pages) if (namespace, tuple(tokens[: (i + 1) * p])) in self.model]
            assert kept == list(range(present, present + len(kept))), (
                f"insert kept new pages {kept}, not a leading run from page {present}")
            if admits_everything:
                assert len(kept) == num_pages - present, f"insert cached {len(kept)} of {num_pages - present} new pages"
            self._close(req)

        def _pick(self, index: int) -> _Request:
            return self.requests.pop(index % len(self.requests))

        # -------------------------------------------------------- rules: sequences
        @initialize()
        def empty_at_start(self) -> None:
            assert self.model == {}, f"a new cache already holds pages: {self.model}"

        @rule(target=sequences, tokens=token_lists(alphabet=alphabet, max_size=max_pages * 2 + 1))
        def new_sequence(self, tokens: List[int]) -> List[int]:
            return tokens

        @rule(target=sequences, base=sequences, suffix=token_lists(alphabet=alphabet, max_size=4))
        def extend(self, base: List[int], suffix: List[int]) -> List[int]:
            return (base + suffix)[: self.max_len]

        @rule(target=sequences, base=sequences, cut=st.integers(0, 1 << 8))
        def truncate(self, base: List[int], cut: int) -> List[int]:
            """A strict prefix of a sequence: matching it ends inside a cached run (splits a node)."""
            return base[: cut % (len(base) + 1)]

        @precondition(lambda self: self.model)
        @rule(target=sequences, index=st.integers(0, 1 << 16), pages=st.integers(0, max_pages),
              tail=token_lists(alphabet=alphabet, min_size=1, max_size=2))
        def cached_prefix(self, index: int, pages: int, tail: List[int]) -> List[int]:
            """A strict whole-page prefix of a cached sequence plus a token or two: ends inside a cached run
            (a locked one too), past any hit cap's last token."""
            p = self.page_size
            _, tokens = sorted(self.model, key=repr)[index % len(self.model)]
            return list(tokens[: (pages % (len(tokens) // p)) * p]) + tail

        @rule(target=sequences, pair=shared_prefix_pairs(alphabet=alphabet, max_size=max_pages + 1))
        def shared_pair(self, pair: Tuple[List[int], List[int]]):
            return multiple(pair[0][: self.max_len], pair[1][: self.max_len])

        # -------------------------------------------------------- rules: calls
        @rule(tokens=sequences, namespace=st.sampled_from(namespace_choices))
        def match(self, tokens: List[int], namespace: Optional[Hashable]) -> None:
            self._match(tokens, namespace)

        @rule(tokens=sequences, namespace=st.sampled_from(namespace_choices))
        def lock_match(self, tokens: List[int], namespace: Optional[Hashable]) -> None:
            self._lock(self._match(tokens, namespace), namespace, tokens)

        def _lock(self, m: Any, namespace: Optional[Hashable], tokens: Sequence[int]) -> Tuple:
            """Lock a match's handle; returns the machine's entry for that lock."""
            self.cache.lock(m.node)
            entry = (m.node, namespace, tuple(tokens[: m.num_tokens]))
            self.locks.append(entry)
            self._observe("lock")
            return entry

        @precondition(lambda self: self._free_locks())
        @rule(index=st.integers(0, 1 << 16))
        def unlock(self, index: int) -> None:
            free = self._free_locks()
            handle, _, _ = self.locks.pop(free[index % len(free)])
            self.cache.unlock(handle)
            self._observe("unlock")

        def _free_locks(self) -> List[int]:
            """Indexes of the locks taken by ``lock_match`` (not by an open request)."""
            owned = {id(r.lock) for r in self.requests}
            return [i for i, entry in enumerate(self.locks) if id(entry) not in owned]

        def _long_locks(self) -> List[int]:
            return [i for i, (_, _, prefix) in enumerate(self.locks) if len(prefix) >= 2 * self.page_size]

        @precondition(lambda self: self._long_locks())
        @rule(index=st.integers(0, 1 << 16), pages=st.integers(1, max_pages),
              tail=token_lists(alphabet=alphabet, min_size=1, max_size=2), lock=st.booleans())
        def match_inside_lock(self, index: int, pages: int, tail: List[int], lock: bool) -> None:
            """Match (and maybe lock) a strict prefix of a locked prefix: the match ends inside a locked run,
            where a tree splits a node that holds locks."""
            long = self._long_locks()
            _, namespace, prefix = self.locks[long[index % len(long)]]
            cut = 1 + (pages - 1) % (len(prefix) // self.page_size - 1)
            tokens = list(prefix[: cut * self.page_size]) + tail
            m = self._match(tokens, namespace)
            if lock:
                self._lock(m, namespace, tokens)

        @precondition(lambda self: unlock_raises)
        @rule(tokens=sequences, namespace=st.sampled_from(namespace_choices))
        def unlock_without_lock(self, tokens: List[int], namespace: Optional[Hashable]) -> None:
            m = self._match(tokens, namespace)
            prefix = tuple(tokens[: m.num_tokens])
            if shared_root and not prefix:
                if any(not pre for _, _, pre in self.locks):
                    return
            elif any(ns == namespace and pre == prefix for _, ns, pre in self.locks):
                return
            try:
                self.cache.unlock(m.node)
            except ValueError:
                pass
            else:
                raise AssertionError(f"unlock of a handle holding no lock ({prefix}, {namespace!r}) did not raise")
            self._observe("failed unlock")

        @rule(tokens=sequences, namespace=st.sampled_from(namespace_choices), fresh=st.booleans())
        def insert(self, tokens: List[int], namespace: Optional[Hashable], fresh: bool) -> None:
            """One request start to end: match, lock, allocate, insert, unlock."""
            req = self._open(tokens, namespace, fresh)
            if req is not None:
                self._finish(req)

        @rule(tokens=sequences, churn=st.integers(0, max(0, len(churn_choices) - 1)))
        def insert_churn(self, tokens: List[int], churn: int) -> None:
            """A request in one of the churn namespaces: their pages compete with everyone's for blocks."""
            req = self._open(tokens, churn_choices[churn], False)
            if req is not None:
                self._finish(req)

        @precondition(lambda self: len(self.requests) < MAX_OPEN_REQUESTS)
        @rule(tokens=sequences, namespace=st.sampled_from(namespace_choices), fresh=st.booleans())
        def open_request(self, tokens: List[int], namespace: Optional[Hashable], fresh: bool) -> None:
            """Start a request and keep it open: its hit stays locked, its blocks held across steps."""
            req = self._open(tokens, namespace, fresh)
            if req is not None:
                self.requests.append(req)

        @precondition(lambda self: self.requests)
        @rule(index=st.integers(0, 1 << 16), suffix=token_lists(alphabet=alphabet, min_size=1, max_size=4))
        def decode(self, index: int, suffix: List[int]) -> None:
            """An open request grows by generated tokens; pages it completes get blocks (if there is room)."""
            req = self._pick(index)
            before = list(req.tokens)
            req.tokens = req.tokens + suffix[: max(0, self.max_len - len(req.tokens))]  # never shorter
            if not self._grow(req):
                req.tokens = before
            self.requests.append(req)

        @precondition(lambda self: self.requests)
        @rule(index=st.integers(0, 1 << 16))
        def finish_request(self, index: int) -> None:
            self._finish(self._pick(index))

        @precondition(lambda self: self.requests and callable(getattr(self.cache, "free", None)))
        @rule(index=st.integers(0, 1 << 16))
        def abort_request(self, index: int) -> None:
            """An aborted request: its allocated blocks are freed uninserted, nothing cached changes."""
            req = self._pick(index)
            self.cache.free(req.allocated)
            req.allocated = []
            self._observe("free")
            self._close(req)

        @precondition(lambda self: not lazy_eviction)
        @rule(n=st.integers(0, 8))
        def evict(self, n: int) -> None:
            evictable = len(self.model) - len(self._protected().intersection(self.model))
            freed = self.cache.evict(n)
            assert freed >= 0 and (over_eviction or freed <= n), f"evict({n}) returned {freed}"
            self._observe(f"evict({n})", exact_dropped=freed)
            if exact_eviction:
                want = min(n, evictable)
                assert freed >= want if over_eviction else freed == want, (
                    f"evict({n}) freed {freed} pages with {evictable} unprotected cached")

        # -------------------------------------------------------- invariants
        @invariant()
        def consistent(self) -> None:
            self.cache.check()
            assert dict(self.cache.contents()) == self.model, "contents() changed outside any call"
            blocks = list(self.model.values())
            assert len(set(blocks)) == len(blocks), (
                f"a block holds two pages: {[b for b, c in Counter(blocks).items() if c > 1]}")
            assert self.block_ids.issuperset(blocks), f"block out of range in {blocks}"
            p = self.page_size
            for namespace, tokens in self.model:
                assert len(tokens) % p == 0 and tokens, f"page key {tokens} is not whole pages"
                if prefix_closed and len(tokens) > p:
                    assert (namespace, tokens[:-p]) in self.model, (
                        f"page {tokens} of {namespace!r} is cached but its predecessor is not")

        def teardown(self) -> None:
            failing = sys.exc_info()[0] is not None  # do not mask the failure being reported
            try:
                while self.requests:
                    req = self.requests.pop()
                    if req.allocated and callable(getattr(self.cache, "free", None)):
                        self.cache.free(req.allocated)
                while self.locks:
                    handle, _, _ = self.locks.pop()
                    self.cache.unlock(handle)
            except Exception:
                if not failing:
                    raise

    return PrefixCacheMachine


def _given(scope: Dict[str, Any]) -> Dict[str, Any]:
    """The keyword arguments of a :func:`make_state_machine` call that differ from their defaults."""
    defaults = make_state_machine.__kwdefaults__ or {}
    return {k: scope[k] for k in defaults if scope[k] is not defaults[k] and scope[k] != defaults[k]}


class _KeyedDatabase(ExampleDatabase):
    """An example database whose keys are prefixed with a target's name, so targets never share examples."""

    def __init__(self, inner: ExampleDatabase, prefix: str) -> None:
        super().__init__()
        self.inner = inner
        self.prefix = prefix.encode() + b"\0"

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def fetch(self, key: bytes):
        return self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.prefix + src, self.prefix + dest, value)

    def __repr__(self) -> str:
        return f"_KeyedDatabase({self.inner!r}, {self.prefix[:-1].decode()!r})"


def _target_name(factory: Union[Factory, Target], options: Mapping[str, Any]) -> str:
    """A key for the example database: the target's name, or where a plain factory was defined."""
    if isinstance(factory, Target):
        return factory.name + (repr(sorted(options.items())) if options else "")
    code = getattr(factory, "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    return f"{getattr(factory, '__module__', '')}.{getattr(factory, '__qualname__', repr(factory))}@{where}" + (
        repr(sorted(options.items())) if options else "")


def conformance_settings(max_examples: int = 100, step_count: int = 30, **overrides: Any) -> settings:
    """Settings for a conformance run: no deadline, one (shrunk) failure reported, ``max_examples`` cases."""
    base = dict(max_examples=max_examples, stateful_step_count=step_count, deadline=None, report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    base.update(overrides)
    return settings(**base)


_UNSET: Any = object()


def run_conformance(target: Union[Factory, Target], *, max_examples: int = 100, step_count: int = 30,
                    settings: Optional[settings] = None, database: Any = _UNSET, **options: Any) -> None:
    """Run the conformance state machine on caches from ``target``; raises with a shrunk example on a bug.

    ``target`` is a :class:`Target` (factory + options, e.g. from
    :mod:`radixkv.testing.targets`) or a plain factory. ``options`` go to
    :func:`make_state_machine` (over a target's own). ``settings`` replaces
    :func:`conformance_settings` (``max_examples``/``step_count`` are then
    ignored); ``database`` is hypothesis's example database (``None`` for
    none). Saved examples are keyed by the target's name (a plain factory: where
    it was defined), so a failure kept for one cache never replays on another.
    """
    if isinstance(target, Target):
        machine = make_state_machine(target.factory, **{**dict(target.options), **options})
    else:
        machine = make_state_machine(target, **options)
    chosen = settings if settings is not None else conformance_settings(max_examples, step_count)
    inner = chosen.database if database is _UNSET else database
    keyed = _KeyedDatabase(inner, _target_name(target, options)) if inner is not None else None
    run_state_machine_as_test(machine, settings=_with_database(chosen, keyed))


def _with_database(chosen: settings, database: Optional[ExampleDatabase]) -> settings:
    return type(chosen)(chosen, database=database)
