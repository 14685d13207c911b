"""PageStore: the content-addressed page store engine processes share.

Pages are addressed by content: a page's key is the chained hash of the
tokens through it, rooted in the store's :class:`~radixkv.store.keys.Fingerprint`
and the request's namespace (:mod:`radixkv.store.keys`), and its value
carries a verified header (:mod:`radixkv.store.codec`). Any engine that
computes the same tokens under the same fingerprint and namespace finds the
page, whichever engine wrote it.

Every call is one batched backend call (one round trip to a single Redis
server; see :mod:`radixkv.store.redis_backends` for a cluster) and serves
only the *leading* run of a chain: a page whose parent is missing is never
served, though Redis may well still hold it (``maxmemory`` eviction picks
pages, not chains). No call raises for a backend that fails: its pages are
misses, counted in :meth:`PageStore.stats`.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ArgumentTypeError, ArgumentValueError
from ..keys import TokensLike
from . import codec
from .backends import FAILED, Backend, Reply, open_backend
from .keys import DEFAULT_PREFIX, Fingerprint, KeyChain, Partition

COUNTERS = ("lookups", "lookup_pages", "gets", "hits", "misses", "integrity_misses", "puts", "pages_written",
            "pages_existing", "pages_failed", "backend_errors", "backend_skips", "round_trips", "bytes_read",
            "bytes_written")
"""The monotonic counters :meth:`PageStore.stats` reports (see there)."""


class PageStore:
    """Shared, content-addressed KV pages with first-writer-wins puts and verified gets.

    >>> fp = Fingerprint(model="llama-3-8b", dtype="float16", kv_shape=(2, 8, 128), page_size=16)
    >>> store = PageStore.open("memory://doc", fingerprint=fp)
    >>> chain = store.chain(range(40))                 # 2 full pages
    >>> store.put(chain, [b"page0", b"page1"])
    2
    >>> pages, n = store.get(chain)
    >>> n, bytes(pages[1])
    (2, b'page1')

    Args:
        backend: where the values live (:func:`~radixkv.store.backends.open_backend`).
        fingerprint: what the pages mean; stores of other fingerprints never see these pages.
        prefix: bytes that start every key (``b"rkv:"``: 36-byte keys).
        hash_fn: the chain's hash, ``"sha256_cbor"`` (default) or ``"sha256"``.
    """

    def __init__(self, backend: Backend, fingerprint: Fingerprint, *, prefix: bytes = DEFAULT_PREFIX,
                 hash_fn: str = "sha256_cbor") -> None:
        self.keys = KeyChain(fingerprint, prefix, hash_fn)
        for method in ("exists", "get", "set_nx", "delete", "close"):
            if not callable(getattr(backend, method, None)):
                raise ArgumentTypeError(f"backend must provide {method}(), got {backend!r}")
        self.backend = backend
        self.fingerprint = fingerprint
        self._fp = self.keys.fingerprint_digest
        self._cut = len(prefix)
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._counts["round_trips"] = getattr(backend, "open_round_trips", 0)
        self.last_error: Optional[BaseException] = None
        """The latest backend failure, for diagnosis."""
        self.last_integrity_miss: str = ""
        """Why the latest refused value was refused (``"digest mismatch"``, ...)."""

    @classmethod
    def open(cls, url: str, fingerprint: Fingerprint, *, timeout: float = 0.25, prefix: bytes = DEFAULT_PREFIX,
             hash_fn: str = "sha256_cbor") -> "PageStore":
        """A store on the backend ``url`` names: ``memory://NAME[?capacity=PAGES]`` or ``redis://HOST:PORT[/DB]``.

        ``timeout`` (seconds) bounds each Redis socket operation: a dead or
        unreachable server costs a call at most that, then is skipped while it
        cools off. An unreachable server is no error here: every call misses
        until it answers. Raises :class:`~radixkv.errors.ArgumentValueError`
        for a bad URL, fingerprint, prefix or hash function.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ArgumentTypeError(f"timeout must be a number of seconds, got {timeout!r}")
        if not 0 < timeout <= 60:
            raise ArgumentValueError(f"timeout must be seconds in (0, 60], got {timeout!r}")
        KeyChain(fingerprint, prefix, hash_fn)  # bad arguments raise before any connection is made
        return cls(open_backend(url, float(timeout)), fingerprint, prefix=prefix, hash_fn=hash_fn)

    # ------------------------------------------------------------------ keys
    def chain(self, tokens: TokensLike, namespace: Partition = None) -> List[bytes]:
        """The keys of ``tokens``' full pages in ``namespace`` (``None``, a str, or a tuple such as
        ``(namespace, tenant)``): one ``bytes`` key per page. No round trip; about 1 us of SHA-256 a page."""
        return self.keys.chain(tokens, namespace)

    # ------------------------------------------------------------------ calls
    def lookup(self, chain: Sequence[bytes], start: int = 0) -> int:
        """How many pages of ``chain[start:]`` are present, counting from ``start`` up to the first gap.

        Not verified (a present page may still fail :meth:`get`'s checks).
        Cost: one round trip (one server; a cluster: one per node holding the
        keys); no page bytes move. A backend failure answers 0.
        """
        keys, start = self.keys.check(chain, start)
        keys = keys[start:]
        if not keys:
            return 0
        reply = self.backend.exists(keys)
        n = 0
        for present in reply.values:
            if present is not True:
                break
            n += 1
        self._account(reply, lookups=1, lookup_pages=n)
        return n

    def get(self, chain: Sequence[bytes], start: int = 0, touch: bool = False) -> Tuple[List[memoryview], int]:
        """The verified payloads of ``chain[start:]``'s leading pages, and how many there are.

        A page is served only if it and every page before it (from
        ``start``) is present and passes every check of its header
        (:mod:`~radixkv.store.codec`). A value that fails one is an integrity
        miss: it is deleted (one more round trip) and serving stops there.
        The payloads are read-only views into the fetched values
        (``bytes(view)`` copies one; ``numpy.frombuffer`` reads it in place).
        Cost: one round trip fetching every page of ``chain[start:]``, one
        SHA-256 pass over each served payload. A backend failure serves nothing.
        With ``touch`` the pages before ``start`` (which the reader holds) are made
        recently used in the same round trip (``TOUCH``): an LRU-bounded store then
        keeps what the fleet uses, not only what it reads from the store.
        """
        keys, start = self.keys.check(chain, start)
        held = keys[:start] if touch else ()
        keys = keys[start:]
        if not keys:
            return [], 0
        reply = self.backend.get(keys, held) if held else self.backend.get(keys)
        pages: List[memoryview] = []
        bad: Optional[bytes] = None
        fp, cut = self._fp, self._cut
        for key, value in zip(keys, reply.values):
            if value is None or value is FAILED:
                break
            payload, why = codec.decode(value, fp, key[cut:])
            if payload is None:
                bad = key
                self.last_integrity_miss = why
                break
            pages.append(payload)
        read = sum(len(v) for v in reply.values if v is not None and v is not FAILED)
        self._account(reply, gets=1, hits=len(pages), misses=len(keys) - len(pages), bytes_read=read,
                      integrity_misses=int(bad is not None))
        if bad is not None:
            self._account(self.backend.delete([bad]))
        return pages, len(pages)

    def put(self, chain: Sequence[bytes], payloads: Sequence[Any], start: int = 0) -> int:
        """Store ``payloads[i]`` as page ``chain[start + i]`` unless that page is there already; how many were new.

        First writer wins: a page some engine stored first is kept (equal keys
        mean equal tokens, so equal KV up to numerics). A payload is bytes or
        any C-contiguous buffer (a numpy array). Cost: one round trip (a
        cluster: one per node), one SHA-256 pass and one copy of each payload.
        A backend failure stores nothing and answers 0.
        """
        keys, start = self.keys.check(chain, start)
        if isinstance(payloads, (str, bytes)) or not hasattr(payloads, "__len__"):
            raise ArgumentTypeError(f"payloads must be a sequence of page payloads, got {type(payloads).__name__}")
        if len(payloads) > len(keys) - start:
            raise ArgumentValueError(f"{len(payloads)} payloads for {len(keys) - start} pages of chain[{start}:]")
        keys = keys[start: start + len(payloads)]
        if not keys:
            return 0
        fp, cut = self._fp, self._cut
        values = [codec.encode(fp, key[cut:], codec.as_payload(p, i)) for i, (key, p) in enumerate(zip(keys, payloads))]
        reply = self.backend.set_nx(keys, values)
        stored = sum(1 for v in reply.values if v is True)
        existing = sum(1 for v in reply.values if v is False)
        sent = sum(len(v) for v, r in zip(values, reply.values) if r is not FAILED)
        self._account(reply, puts=1, pages_written=stored, pages_existing=existing,
                      pages_failed=len(keys) - stored - existing, bytes_written=sent)
        return stored

    # ------------------------------------------------------------------ accounting
    def _account(self, reply: Reply, **counts: int) -> None:
        with self._lock:
            c = self._counts
            for name, n in counts.items():
                c[name] += n
            c["round_trips"] += reply.round_trips
            c["backend_errors"] += reply.errors
            c["backend_skips"] += reply.skipped
            first = reply.errors and c["backend_errors"] == reply.errors
        if reply.error is not None:
            self.last_error = reply.error
        if first:
            warnings.warn(f"page store {self.backend.url}: backend call failed ({reply.error!r}); its pages count "
                          "as misses (stats()['backend_errors'] counts these)", RuntimeWarning, stacklevel=3)

    def stats(self) -> Dict[str, Any]:
        """The counters and the backend's state, as a dict (a snapshot; thread-safe).

        ``lookups``/``gets``/``puts``: calls. ``lookup_pages``: leading pages
        lookups found. ``hits``: pages ``get`` served; ``misses``: pages it was
        asked for and did not serve (absent, past a gap, failed or refused).
        ``integrity_misses``: values refused by a check (and deleted).
        ``pages_written``: pages ``put`` stored; ``pages_existing``: pages it
        found stored already; ``pages_failed``: pages a failing or refusing
        backend did not store. ``backend_errors``: backend requests that failed
        (no answer, or error replies); ``backend_skips``: requests not sent to
        a server cooling off after a failure. ``round_trips``: requests sent.
        ``bytes_read``/``bytes_written``: value bytes (header included) fetched
        and sent. Also ``backend`` (its kind), ``url`` (password masked) and
        what the backend reports (a memory store's pages and evictions, a
        cluster's failing nodes).
        """
        with self._lock:
            out: Dict[str, Any] = dict(self._counts)
        out["backend"] = self.backend.kind
        out["url"] = self.backend.url
        info = getattr(self.backend, "info", None)
        if callable(info):
            out.update(info())
        return out

    def close(self) -> None:
        """Close the backend's connections; the pages stay for the other engines."""
        self.backend.close()

    def __enter__(self) -> "PageStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PageStore({self.backend.url!r}, {self.fingerprint!r})"


__all__ = ["COUNTERS", "PageStore"]
