"""vLLM-compatible chained block hashes.

A page's hash covers its own tokens and, through its parent's hash, every
token before it, so equal hashes mean equal prefixes. This module reproduces
vLLM 0.33.0's ``hash_block_tokens`` (``vllm/v1/core/kv_cache_utils.py``)::

    hash = hash_function((parent_block_hash or NONE_HASH, tuple(page_tokens), extra_keys))

with vLLM's defaults: ``hash_function`` is vLLM's ``sha256`` (SHA-256 of
``pickle.dumps(obj, HIGHEST_PROTOCOL)``, ``--prefix-caching-hash-algo
sha256``) and ``NONE_HASH``, the parent hash of a sequence's first page, is
``hash_function(seed)`` with the seed vLLM's ``init_none_hash`` picks:
``PYTHONHASHSEED`` if set, else ``"vllm-none-hash"``. So radixkv's default
hashes equal those of a vLLM instance started with default settings and
``PYTHONHASHSEED`` unset. vLLM's ``sha256_cbor`` (SHA-256 over canonical CBOR,
RFC 8949; deterministic across Python versions and languages) is offered as
``hash_fn="sha256_cbor"``; the CBOR encoder here is a small, dependency-free
one covering exactly the types block hashes use (ints, strings, bytes,
tuples/lists, ``None``, booleans) and produces the same bytes as
``cbor2.dumps(obj, canonical=True)`` for them. Pickle's bytes are those of
the running Python's ``HIGHEST_PROTOCOL``, as in vLLM.

Namespaces. A radixkv namespace (SGLang's ``extra_key``, vLLM's
``cache_salt``) enters the hash exactly as vLLM's ``cache_salt`` does: as the
tagged extra key ``(("cache_salt", namespace),)`` of the *first* page only;
the chain carries it to every later page. So two namespaces never share a
hash, and a vLLM router that hashes a request with ``cache_salt=namespace``
finds radixkv's pages. (One deliberate difference: vLLM ignores an empty
``cache_salt``; radixkv keeps ``""`` distinct from ``None`` because they are
distinct trees.) :func:`vllm_extra_keys` builds vLLM's extra keys for pages
that also carry a LoRA adapter or multimodal items, in vLLM's order.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from typing import Any, Callable, Hashable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError
from ..keys import as_tokens, check_namespace, check_positive_int

BlockHash = bytes
"""A full block hash: 32 bytes of SHA-256 (vLLM's ``BlockHash``)."""

DEFAULT_HASH_FN = "sha256"
"""vLLM 0.33.0's default ``prefix_caching_hash_algo``."""
DEFAULT_HASH_SEED = "vllm-none-hash"
"""vLLM 0.33.0's ``NONE_HASH`` seed for SHA-256 when ``PYTHONHASHSEED`` is unset."""
CACHE_SALT_TAG = "cache_salt"
"""The tag of a cache salt (radixkv namespace) in vLLM's extra keys."""
_U64 = (1 << 64) - 1


# ---------------------------------------------------------------- canonical CBOR
def _head(major: int, value: int) -> bytes:
    """A CBOR item head: major type and argument in the shortest form."""
    mt = major << 5
    if value < 24:
        return bytes((mt | value,))
    if value < 0x100:
        return bytes((mt | 24, value))
    if value < 0x10000:
        return bytes((mt | 25,)) + struct.pack(">H", value)
    if value < 0x100000000:
        return bytes((mt | 26,)) + struct.pack(">I", value)
    if value <= _U64:
        return bytes((mt | 27,)) + struct.pack(">Q", value)
    raise ArgumentValueError(f"integer {value!r} does not fit CBOR's 64-bit argument")


def _encode(obj: Any, out: List[bytes]) -> None:
    if obj is None:
        out.append(b"\xf6")
    elif obj is True:
        out.append(b"\xf5")
    elif obj is False:
        out.append(b"\xf4")
    elif isinstance(obj, (int, np.integer)):
        value = int(obj)
        out.append(_head(0, value) if value >= 0 else _head(1, -1 - value))
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        out.append(_head(2, len(data)))
        out.append(data)
    elif isinstance(obj, str):
        try:
            data = obj.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 (CBOR text) form
            raise ArgumentValueError(f"cannot CBOR-encode {obj!r} in a block hash: {exc.reason}") from None
        out.append(_head(3, len(data)))
        out.append(data)
    elif isinstance(obj, (tuple, list)):
        out.append(_head(4, len(obj)))
        for item in obj:
            _encode(item, out)
    else:
        raise ArgumentTypeError(f"cannot CBOR-encode {type(obj).__name__} value {obj!r} in a block hash")


def cbor_dumps(obj: Any) -> bytes:
    """Canonical CBOR bytes of ``obj`` (ints, str, bytes, tuples/lists, None, bools).

    Equal to ``cbor2.dumps(obj, canonical=True)`` for those types. Cost: O(size).
    """
    out: List[bytes] = []
    _encode(obj, out)
    return b"".join(out)


# ---------------------------------------------------------------- hash functions
def sha256_cbor(input: Any) -> bytes:  # noqa: A002 - vLLM's parameter name
    """SHA-256 of the canonical CBOR encoding of ``input`` (vLLM's ``sha256_cbor``)."""
    return hashlib.sha256(cbor_dumps(input)).digest()


def sha256(input: Any) -> bytes:  # noqa: A002
    """SHA-256 of ``pickle.dumps(input, HIGHEST_PROTOCOL)`` (vLLM's ``sha256``).

    Deterministic for one Python version only; prefer :func:`sha256_cbor`.
    """
    return hashlib.sha256(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)).digest()


HASH_FUNCTIONS: dict = {"sha256_cbor": sha256_cbor, "sha256": sha256}
"""Hash functions by vLLM's ``prefix_caching_hash_algo`` name."""


def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: Optional[BlockHash],
    curr_block_token_ids: Sequence[int],
    extra_keys: Optional[Tuple[Any, ...]] = None,
    *,
    none_hash: Optional[BlockHash] = None,
) -> BlockHash:
    """The hash of one full page, chained on its parent's (vLLM's ``hash_block_tokens``).

    ``parent_block_hash`` is ``None`` for a sequence's first page; then
    ``none_hash`` (default ``hash_function(DEFAULT_HASH_SEED)``) stands in, as
    vLLM's ``NONE_HASH`` does. Cost: one serialization and one SHA-256 of the page.
    """
    if not parent_block_hash:
        parent_block_hash = none_hash if none_hash is not None else hash_function(DEFAULT_HASH_SEED)
    return hash_function((parent_block_hash, tuple(int(t) for t in curr_block_token_ids), extra_keys))


def external_block_hash(block_hash: BlockHash) -> int:
    """The 64-bit integer form events carry: the digest's last 8 bytes, big-endian.

    This is vLLM's ``maybe_convert_block_hash`` with
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` set, and the int64 shape SGLang's
    events use. Unsigned, in ``[0, 2**64)``.
    """
    return int.from_bytes(block_hash, "big") & _U64


def _check_namespace(namespace: Hashable) -> None:
    if not isinstance(namespace, (str, bytes, int, tuple)) or isinstance(namespace, bool):
        raise ArgumentTypeError(f"namespace must be a str (or bytes, int, tuple) to be hashed, got {namespace!r}")


def namespace_extra_keys(namespace: Optional[Hashable], page_index: int) -> Optional[Tuple[Any, ...]]:
    """Extra keys of page ``page_index`` of a sequence in ``namespace``.

    ``(("cache_salt", namespace),)`` on the first page (vLLM's tagged
    ``cache_salt`` key), else ``None``. Namespaces must be str, bytes, int or
    tuples of those.
    """
    if page_index != 0 or namespace is None:
        return None
    _check_namespace(namespace)
    return ((CACHE_SALT_TAG, namespace),)


def vllm_extra_keys(page_index: int, *, cache_salt: Optional[str] = None,
                    lora: Optional[Tuple[str, str]] = None,
                    mm: Sequence[Tuple[Any, int]] = ()) -> Optional[Tuple[Any, ...]]:
    """vLLM 0.33.0's ``generate_block_hash_extra_keys`` for page ``page_index``.

    In vLLM's order: ``("lora", name, path)`` on every page of a LoRA request
    (``lora=(name, path)``), then ``("mm", identifier, offset)`` for each
    multimodal item ``(identifier, offset)`` overlapping this page (offset
    relative to the page's first token; the caller finds them), then
    ``("cache_salt", salt)`` on the first page if ``cache_salt`` is non-empty;
    ``None`` when there are none. (vLLM appends prompt-embedding digests last;
    radixkv pages never carry them.) Cost: O(keys).
    """
    keys: List[Any] = []
    if lora is not None:
        name, path = lora
        keys.append(("lora", name, path))
    keys.extend(("mm", identifier, offset) for identifier, offset in mm)
    if page_index == 0 and cache_salt:
        keys.append((CACHE_SALT_TAG, cache_salt))
    return tuple(keys) if keys else None


_BULK_TOKENS = 96  # from this many tokens on, encode in numpy


def _cbor_uints(values: np.ndarray) -> Tuple[bytes, np.ndarray]:
    """Canonical CBOR of each unsigned int in ``values`` (< 2**32), concatenated; and each one's length."""
    v = values.astype(np.uint32, copy=False).ravel()
    lens = np.where(v < 24, 1, np.where(v < 0x100, 2, np.where(v < 0x10000, 3, 5))).astype(np.int64)
    m = np.zeros((len(v), 5), dtype=np.uint8)
    b0, b1, b2, b3 = (v >> 24).astype(np.uint8), (v >> 16).astype(np.uint8), (v >> 8).astype(np.uint8), v.astype(np.uint8)
    one, two, three, five = lens == 1, lens == 2, lens == 3, lens == 5
    m[one, 0] = b3[one]
    m[two, 0], m[two, 1] = 0x18, b3[two]
    m[three, 0], m[three, 1], m[three, 2] = 0x19, b2[three], b3[three]
    m[five, 0], m[five, 1], m[five, 2], m[five, 3], m[five, 4] = 0x1A, b0[five], b1[five], b2[five], b3[five]
    return m[np.arange(5)[None, :] < lens[:, None]].tobytes(), lens


def _chain_sha256_cbor(page_tokens: np.ndarray, parent: BlockHash, first_page: int,
                       namespace: Optional[Hashable]) -> List[BlockHash]:
    """:meth:`BlockHasher.chain` for ``sha256_cbor``: byte-identical, encoded in bulk."""
    num_pages, page_size = page_tokens.shape
    if page_tokens.size >= _BULK_TOKENS:
        encoded, lens = _cbor_uints(page_tokens)
        starts, ends = zip(*_page_slices(lens, num_pages, page_size))
    else:  # a few pages: numpy's per-call overhead would dominate
        rows = [b"".join([_head(0, t) for t in row]) for row in page_tokens.tolist()]
        encoded = b"".join(rows)
        ends = np.cumsum([len(r) for r in rows]).tolist()
        starts = [0] + ends[:-1]
    lead = b"\x83" + _head(2, 32)  # array(3) [ parent hash (32-byte string), tokens, extra keys ]
    head = _head(4, page_size)
    suffixes = [head + encoded[a:b] + b"\xf6" for a, b in zip(starts, ends)]
    if namespace is not None and first_page == 0:  # the namespace is the first page's extra key
        suffixes[0] = suffixes[0][:-1] + cbor_dumps(namespace_extra_keys(namespace, 0))
    sha = hashlib.sha256
    out: List[BlockHash] = []
    append = out.append
    for suffix in suffixes:
        parent = sha(lead + parent + suffix).digest()
        append(parent)
    return out


def _pickle_uints(values: np.ndarray) -> Tuple[bytes, np.ndarray]:
    """Pickle opcodes of each unsigned int in ``values`` (< 2**32), concatenated; and each one's length.

    ``BININT1`` (K), ``BININT2`` (M), ``BININT`` (J) or ``LONG1`` (5 bytes) as
    ``pickle.dumps`` writes them (protocol 2 and up).
    """
    v = values.astype(np.uint32, copy=False).ravel()
    lens = np.where(v < 0x100, 2, np.where(v < 0x10000, 3, np.where(v < 0x80000000, 5, 7))).astype(np.int64)
    m = np.zeros((len(v), 7), dtype=np.uint8)
    le = v.astype("<u4").view(np.uint8).reshape(-1, 4)
    m[:, 0] = np.where(lens == 2, ord("K"), np.where(lens == 3, ord("M"), np.where(lens == 5, ord("J"), 0x8A)))
    m[:, 1:5] = le
    big = lens == 7
    m[big, 1], m[big, 2:6], m[big, 6] = 5, le[big], 0
    return m[np.arange(7)[None, :] < lens[:, None]].tobytes(), lens


def _page_slices(lens: np.ndarray, num_pages: int, page_size: int) -> List[Tuple[int, int]]:
    """(start, end) in the concatenated encoding of each page's tokens."""
    ends = np.cumsum(lens.reshape(num_pages, page_size).sum(axis=1)).tolist()
    return list(zip([0] + ends[:-1], ends))


_PICKLE_FRAME_LIMIT = 60_000  # pickle splits frames past 64 KiB; longer pages take pickle.dumps itself


def _chain_sha256_pickle(page_tokens: np.ndarray, parent: BlockHash, first_page: int,
                         namespace: Optional[Hashable]) -> Optional[List[BlockHash]]:
    """:meth:`BlockHasher.chain` for ``sha256``: byte-identical to ``pickle.dumps`` (protocol 5), encoded in bulk.

    Each page pickles as ``PROTO 5, FRAME n, SHORT_BINBYTES parent, MEMOIZE,
    (tokens tuple), MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP``; the namespaced first
    page goes through ``pickle.dumps`` itself. ``None`` when this layout does
    not apply (another pickle protocol, pages too long for one frame).
    """
    num_pages, page_size = page_tokens.shape
    if pickle.HIGHEST_PROTOCOL != 5 or page_size * 7 > _PICKLE_FRAME_LIMIT:
        return None
    encoded, lens = _pickle_uints(page_tokens)
    # TUPLE1..3 (0x85..0x87) for short tuples, else MARK ... TUPLE
    head, tail = (b"", bytes((0x84 + page_size,))) if page_size <= 3 else (b"(", b"t")
    fixed = 2 + 32 + 1 + len(head) + len(tail) + 1 + 4  # C 32 parent MEMOIZE ... MEMOIZE N TUPLE3 MEMOIZE STOP
    sha = hashlib.sha256
    pack = struct.Struct("<Q").pack
    out: List[BlockHash] = []
    append = out.append
    for i, (a, b) in enumerate(_page_slices(lens, num_pages, page_size)):
        if namespace is not None and first_page + i == 0:
            parent = sha256((parent, tuple(page_tokens[i].tolist()), namespace_extra_keys(namespace, 0)))
        else:
            parent = sha(b"\x80\x05\x95" + pack(fixed + b - a) + b"C\x20" + parent + b"\x94"
                         + head + encoded[a:b] + tail + b"\x94N\x87\x94.").digest()
        append(parent)
    return out


def external_block_hash_array(block_hashes: List[BlockHash]) -> Optional[np.ndarray]:
    """:func:`external_block_hash` of many 32-byte hashes as one uint64 array (one numpy pass), or
    ``None`` when they are not all 32 bytes long (a custom hash function)."""
    joined = b"".join(block_hashes)
    if len(joined) != 32 * len(block_hashes):
        return None
    return np.frombuffer(joined, dtype=">u8").reshape(-1, 4)[:, 3].astype(np.uint64)


def external_block_hashes(block_hashes: List[BlockHash]) -> List[int]:
    """:func:`external_block_hash` of many hashes at once (one numpy pass)."""
    if not block_hashes:
        return []
    words = external_block_hash_array(block_hashes)
    if words is None:
        return [external_block_hash(h) for h in block_hashes]
    return words.tolist()


class BlockHasher:
    """Chained page hashes with a fixed hash function and seed.

    The defaults are vLLM 0.33.0's (``sha256`` over pickle, seed
    ``"vllm-none-hash"``, events carrying 64-bit int hashes), so a router
    hashing requests the way a default vLLM does finds radixkv's pages.

    >>> hasher = BlockHasher()
    >>> hashes = hasher.hash_pages([1, 2, 3, 4, 5], page_size=2)   # 2 full pages
    >>> len(hashes), len(hashes[0])
    (2, 32)

    Args:
        hash_fn: ``"sha256"`` (default), ``"sha256_cbor"`` or a callable ``obj -> bytes``
            (vLLM's ``--prefix-caching-hash-algo``).
        hash_seed: the seed ``NONE_HASH`` is made from: vLLM's ``PYTHONHASHSEED``
            if the vLLM instance has it set, else ``"vllm-none-hash"`` (default).
        use_int_block_hashes: events carry the 64-bit int form of each hash
            (default, like vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or,
            when ``False``, the full hash bytes.
    """

    __slots__ = ("hash_function", "hash_seed", "none_hash", "name", "use_int_block_hashes")

    def __init__(self, hash_fn: Union[str, Callable[[Any], bytes]] = DEFAULT_HASH_FN,
                 hash_seed: str = DEFAULT_HASH_SEED, *, use_int_block_hashes: bool = True) -> None:
        if isinstance(hash_fn, str):
            if hash_fn not in HASH_FUNCTIONS:
                raise ArgumentValueError(f"hash_fn must be one of {sorted(HASH_FUNCTIONS)} or a callable, got {hash_fn!r}")
            self.name = hash_fn
            self.hash_function = HASH_FUNCTIONS[hash_fn]
        elif callable(hash_fn):
            self.name = getattr(hash_fn, "__name__", "custom")
            self.hash_function = hash_fn
        else:
            raise ArgumentTypeError(f"hash_fn must be a name or a callable, got {hash_fn!r}")
        if not isinstance(hash_seed, str):
            raise ArgumentTypeError(f"hash_seed must be a str (like PYTHONHASHSEED), got {hash_seed!r}")
        if not isinstance(use_int_block_hashes, bool):
            raise ArgumentTypeError(f"use_int_block_hashes must be a bool, got {use_int_block_hashes!r}")
        self.hash_seed = hash_seed
        self.use_int_block_hashes = use_int_block_hashes
        self.none_hash: BlockHash = self.hash_function(hash_seed)
        if not isinstance(self.none_hash, bytes) or len(self.none_hash) != 32:
            raise ArgumentValueError(f"hash_fn must return 32-byte digests, got {self.none_hash!r}")

    def event_hash(self, block_hash: BlockHash) -> Union[int, bytes]:
        """``block_hash`` as events carry it: its 64-bit int form, or the bytes (vLLM's ``maybe_convert_block_hash``)."""
        return external_block_hash(block_hash) if self.use_int_block_hashes else block_hash

    def event_hashes(self, block_hashes: List[BlockHash]) -> List[Union[int, bytes]]:
        """:meth:`event_hash` of many hashes at once. O(n), one numpy pass for the int form."""
        return external_block_hashes(block_hashes) if self.use_int_block_hashes else list(block_hashes)

    def hash_block_tokens(self, parent_block_hash: Optional[BlockHash], curr_block_token_ids: Sequence[int],
                          extra_keys: Optional[Tuple[Any, ...]] = None) -> BlockHash:
        """Hash of one page after ``parent_block_hash`` (``None`` for the first page)."""
        if not parent_block_hash:
            parent_block_hash = self.none_hash
        return self.hash_function((parent_block_hash, tuple(int(t) for t in curr_block_token_ids), extra_keys))

    def chain(self, page_tokens: np.ndarray, parent_block_hash: Optional[BlockHash],
              first_page: int, namespace: Optional[Hashable]) -> List[BlockHash]:
        """Hashes of consecutive pages (rows of ``page_tokens``) starting at page ``first_page``.

        Engine-internal: ``page_tokens`` is a 2-D array of whole pages of
        non-negative tokens. With ``sha256`` or ``sha256_cbor`` the pages are
        pickled or CBOR-encoded all at once in numpy, leaving one SHA-256 call
        per page in Python (about 1 us a page); other hash functions
        serialize page by page.
        """
        parent = parent_block_hash or self.none_hash
        if page_tokens.size >= _BULK_TOKENS and self.hash_function is sha256:
            fast = _chain_sha256_pickle(page_tokens, parent, first_page, namespace)
            if fast is not None:
                return fast
        if self.hash_function is sha256_cbor and page_tokens.size:
            return _chain_sha256_cbor(page_tokens, parent, first_page, namespace)
        out: List[BlockHash] = []
        fn = self.hash_function
        for i, row in enumerate(page_tokens.tolist()):
            extra = namespace_extra_keys(namespace, first_page + i)
            parent = fn((parent, tuple(row), extra))
            out.append(parent)
        return out

    def hash_pages(self, tokens: Union[Sequence[int], np.ndarray], page_size: int, *,
                   namespace: Optional[Hashable] = None) -> List[BlockHash]:
        """Hashes of every full page of ``tokens`` in ``namespace``, in order.

        Equal to vLLM's request block hasher for a request with
        ``cache_salt=namespace`` (no LoRA, no multimodal inputs, a non-empty
        salt) when the hash function and seed are that vLLM's. Cost: O(len(tokens)).
        """
        page_size = check_positive_int(page_size, "page_size")
        if isinstance(namespace, str):  # the cache's rule, whatever the hash function can encode
            check_namespace(namespace)
        arr = as_tokens(tokens)
        num_pages = len(arr) // page_size
        pages = arr[: num_pages * page_size].reshape(num_pages, page_size)
        return self.chain(pages, None, 0, namespace)

    def __repr__(self) -> str:
        return (f"BlockHasher(hash_fn={self.name!r}, hash_seed={self.hash_seed!r}, "
                f"use_int_block_hashes={self.use_int_block_hashes!r})")


__all__ = [
    "BlockHash", "BlockHasher", "CACHE_SALT_TAG", "DEFAULT_HASH_FN", "DEFAULT_HASH_SEED", "HASH_FUNCTIONS", "cbor_dumps",
    "external_block_hash", "external_block_hash_array", "external_block_hashes", "hash_block_tokens", "namespace_extra_keys", "sha256", "sha256_cbor",
    "vllm_extra_keys",
]
