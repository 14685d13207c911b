"""A deterministic built-in tokenizer for cache simulation.

Text is split into *pieces* (runs of ASCII letters, digits and ``_`` of at
most :data:`MAX_PIECE_CHARS` characters, or any other single non-whitespace
character) and each piece maps to ``blake2b(piece.encode("utf-8"),
digest_size=8)`` read as a little-endian integer, modulo the vocabulary size.

It is **for cache simulation only**: the ids mean nothing to any model. What
it promises is what a prefix cache cares about:

* the same text gives the same ids on every machine and every Python version
  (no ``hash()``, no locale, no Unicode-database-dependent regex classes);
* tokenization is per piece, left to right, so two texts that agree up to a
  piece boundary give ids that agree up to the same point: shared prompt
  prefixes stay shared token prefixes;
* token counts are roughly those of a real subword tokenizer on English
  (one id per short word or punctuation mark, long words and blobs split
  every 8 characters, one id per non-ASCII character, as for CJK text).

Whitespace only separates pieces and produces no id, so ``"a b"`` and
``"a\\nb"`` tokenize alike. Distinct pieces can collide modulo the vocabulary
(as in any hashed vocabulary); with the default 128 000 ids that is rare
enough not to matter for hit rates.

Example:
    >>> tokenize("Hello, world!").tolist()
    [107580, 5126, 94552, 11839]
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import ArgumentTypeError
from ..keys import TOKEN_DTYPE, check_int

DEFAULT_VOCAB_SIZE = 128_000
"""Default number of distinct ids, about the size of current LLM vocabularies (Llama 3: 128 256)."""

MAX_PIECE_CHARS = 8
"""Longest run of ASCII word characters kept as one piece; longer runs are split."""

# Character classes are spelled out rather than written as \w / \s so that
# the split does not depend on the Unicode tables of the running Python.
_PIECE = re.compile(r"[A-Za-z0-9_]{1,%d}|[^ \t\n\r\f\vA-Za-z0-9_]" % MAX_PIECE_CHARS)

_MAX_VOCAB_SIZE = 2**32  # ids are stored as uint32


def split_pieces(text: str) -> list[str]:
    """The pieces ``text`` is cut into, left to right (whitespace dropped).

    Cost: O(len(text)).

    Example:
        >>> split_pieces("Don't  cache-me!")
        ['Don', "'", 't', 'cache', '-', 'me', '!']
    """
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a str, got {text!r}")
    return _PIECE.findall(text)


@lru_cache(maxsize=1 << 16)
def _piece_id(piece: str, vocab_size: int) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


def _check_vocab_size(vocab_size: object) -> int:
    return check_int(vocab_size, "vocab_size", minimum=1, maximum=_MAX_VOCAB_SIZE, bound="in [1, 2**32]")


def tokenize(text: str, vocab_size: int = DEFAULT_VOCAB_SIZE) -> np.ndarray:
    """Token ids of ``text``: a new 1-D ``uint32`` array with values in ``[0, vocab_size)``.

    Cost: O(len(text)); piece ids are memoised (64 Ki most recent pieces).

    Example:
        >>> tokenize("Hello, world!", vocab_size=1000).tolist()
        [580, 126, 552, 839]
    """
    vocab_size = _check_vocab_size(vocab_size)
    pieces = split_pieces(text)
    return np.fromiter(
        (_piece_id(p, vocab_size) for p in pieces), dtype=TOKEN_DTYPE, count=len(pieces)
    )


@dataclass(frozen=True, slots=True)
class Tokenizer:
    """:func:`tokenize` bound to a vocabulary size, usable as ``tokenizer(text)``.

    Attributes:
        vocab_size: number of distinct ids; ids fall in ``[0, vocab_size)``.
    """

    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocab_size", _check_vocab_size(self.vocab_size))

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (see :func:`tokenize`). Cost: O(len(text))."""
        return tokenize(text, self.vocab_size)

    def __call__(self, text: str) -> np.ndarray:
        return tokenize(text, self.vocab_size)
