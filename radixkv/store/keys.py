"""Page keys of the shared store: a chained hash of the tokens, rooted in what the bytes mean and whose they are.

A page's key is ``prefix + hash`` (:data:`HASH_BYTES` = 32 bytes of SHA-256;
with the default prefix ``b"rkv:"`` a key is 36 bytes). The hash is
:class:`~radixkv.events.hashing.BlockHasher`'s chain, vLLM's
``hash_block_tokens`` page by page (``hash = H((parent, page tokens,
extra keys))``), with two changes at the root:

* the first page's parent (vLLM's ``NONE_HASH``) is ``H(seed)`` with the seed
  ``"radixkv-store/1:" + fingerprint digest``, so two models, dtypes, KV
  shapes, page sizes or tensor-parallel ranks never share a key;
* the partition (namespace, tenant, or a tuple of them) is the first page's
  extra key, exactly where vLLM puts a ``cache_salt``, so two isolated
  partitions never share a key either.

The chain carries both to every later page. ``H`` is ``sha256_cbor`` by
default (SHA-256 of canonical CBOR): the same bytes on every Python version
and in any language, which a fleet of engines needs; vLLM's default
``sha256`` over pickle is offered, but its bytes depend on the Python version
(two engines on different Pythons would silently never hit each other).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Hashable, List, Tuple

from ..errors import ArgumentTypeError, ArgumentValueError
from ..events.hashing import BlockHasher, cbor_dumps
from ..keys import TokensLike, as_tokens, check_int, check_namespace

HASH_BYTES = 32
"""Bytes of a page hash (SHA-256) at the end of every key."""
DEFAULT_PREFIX = b"rkv:"
"""The default key prefix: 4 bytes, so a key is 36 bytes."""
FINGERPRINT_DIGEST_BYTES = 16
"""Bytes of :meth:`Fingerprint.digest` (blake2b), as stored in every value's header."""
SEED_PREFIX = "radixkv-store/1:"
"""The root seed is this plus the fingerprint digest in hex; the ``1`` changes if the key scheme does."""

Partition = Hashable
"""``None``, a str, an int, bytes, or a tuple of those (``(namespace, tenant)``; tuples may nest and hold ``None``)."""


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"fingerprint {name} must be a str, got {value!r}")
    check_namespace(value)  # valid Unicode: it is hashed as UTF-8
    return value


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What a page's bytes mean; engines whose fingerprints differ never read each other's pages.

    Every field is compared exactly (``"float16"`` and ``"fp16"`` differ):
    the engines of one fleet must spell them alike.

    Args:
        model: model name or revision (``"llama-3-8b"``).
        dtype: KV element type (``"float16"``, ``"bfloat16"``, ``"fp8_e4m3"``).
        kv_shape: the KV shape of one token on this rank (e.g. ``(layers, 2, kv_heads, head_dim)``).
        page_size: tokens per page; also how :meth:`PageStore.chain` cuts tokens into pages.
        tp_rank: tensor-parallel rank whose shard the pages hold.
        extra: anything else that changes the bytes (tensor-parallel size, quantization
            layout, a layer split, an engine-wide adapter); ``""`` by default.
    """

    model: str
    dtype: str
    kv_shape: Tuple[int, ...]
    page_size: int
    tp_rank: int = 0
    extra: str = ""

    def __post_init__(self) -> None:
        for name in ("model", "dtype"):
            if not _text(getattr(self, name), name):
                raise ArgumentValueError(f"fingerprint {name} must be non-empty")
        _text(self.extra, "extra")
        shape = self.kv_shape
        if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)) or not shape:
            raise ArgumentTypeError(f"fingerprint kv_shape must be a non-empty tuple of ints, got {shape!r}")
        shape = tuple(check_int(d, "fingerprint kv_shape entry", minimum=1, bound="> 0") for d in shape)
        object.__setattr__(self, "kv_shape", shape)
        page_size = check_int(self.page_size, "fingerprint page_size", minimum=1, bound="> 0")
        object.__setattr__(self, "page_size", page_size)
        object.__setattr__(self, "tp_rank", check_int(self.tp_rank, "fingerprint tp_rank"))

    def digest(self) -> bytes:
        """16 bytes of blake2b over the canonical CBOR of every field (stored in each value's header). O(1)."""
        fields = ("radixkv.store.Fingerprint", 1, self.model, self.dtype, list(self.kv_shape),
                  self.page_size, self.tp_rank, self.extra)
        return hashlib.blake2b(cbor_dumps(fields), digest_size=FINGERPRINT_DIGEST_BYTES).digest()


def check_partition(partition: object) -> None:
    """Raise unless ``partition`` is ``None``, a str (valid Unicode), an int, bytes, or a tuple of those.

    Those are the values with one canonical encoding (CBOR), so every engine
    hashes a partition to the same key. O(size).
    """
    if partition is None or isinstance(partition, (bytes, int)) and not isinstance(partition, bool):
        return
    if isinstance(partition, str):
        check_namespace(partition)
    elif isinstance(partition, tuple):
        for item in partition:
            check_partition(item)
    else:
        raise ArgumentTypeError(f"partition must be None, a str, int, bytes or a tuple of those, got {partition!r}")


class KeyChain:
    """Turns tokens into the store's page keys for one fingerprint.

    Args:
        fingerprint: what the pages mean (its digest salts the root).
        prefix: bytes every key starts with.
        hash_fn: ``"sha256_cbor"`` (default) or ``"sha256"`` (vLLM's default, pickle-based).
    """

    def __init__(self, fingerprint: Fingerprint, prefix: bytes = DEFAULT_PREFIX, hash_fn: str = "sha256_cbor") -> None:
        if not isinstance(fingerprint, Fingerprint):
            raise ArgumentTypeError(f"fingerprint must be a Fingerprint, got {fingerprint!r}")
        if not isinstance(prefix, bytes):
            raise ArgumentTypeError(f"prefix must be bytes, got {prefix!r}")
        if hash_fn not in ("sha256_cbor", "sha256"):
            raise ArgumentValueError(f"hash_fn must be 'sha256_cbor' or 'sha256', got {hash_fn!r}")
        self.fingerprint = fingerprint
        self.prefix = prefix
        self.key_bytes = len(prefix) + HASH_BYTES
        self.fingerprint_digest = fingerprint.digest()
        self.hash_seed = SEED_PREFIX + self.fingerprint_digest.hex()
        self._hasher = BlockHasher(hash_fn, self.hash_seed)

    def chain(self, tokens: TokensLike, partition: Partition = None) -> List[bytes]:
        """Keys of every full page of ``tokens`` in ``partition``, in order (a trailing partial page has none).

        Raises :class:`~radixkv.errors.ArgumentTypeError` /
        :class:`~radixkv.errors.ArgumentValueError` for bad tokens or
        partition. Cost: O(len(tokens)), about 1 us of SHA-256 per page.
        """
        check_partition(partition)
        arr = as_tokens(tokens)
        size = self.fingerprint.page_size
        num_pages = len(arr) // size
        if not num_pages:
            return []
        pages = arr[: num_pages * size].reshape(num_pages, size)
        prefix = self.prefix
        return [prefix + h for h in self._hasher.chain(pages, None, 0, partition)]

    def check(self, chain: Any, start: Any, name: str = "chain") -> Tuple[List[bytes], int]:
        """``chain`` as a list of this store's keys and ``start`` as an index into it, or raise. O(len(chain))."""
        if isinstance(chain, (str, bytes)) or not hasattr(chain, "__len__"):
            raise ArgumentTypeError(f"{name} must be a list of page keys (bytes), got {type(chain).__name__}")
        keys = list(chain)
        start = check_int(start, "start", maximum=len(keys))
        size, prefix = self.key_bytes, self.prefix
        for i, key in enumerate(keys):
            if key.__class__ is not bytes or len(key) != size or not key.startswith(prefix):
                raise ArgumentValueError(f"{name}[{i}] is not a key of this store ({size} bytes starting "
                                         f"{prefix!r}): {key!r:.60}")
        return keys, start


__all__ = ["DEFAULT_PREFIX", "Fingerprint", "HASH_BYTES", "KeyChain", "Partition", "check_partition"]
