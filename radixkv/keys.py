"""Token validation and page keys.

Every public entry point funnels its ``tokens`` argument through
:func:`as_tokens`, so the rest of radixkv can assume a contiguous 1-D
``uint32`` array. Pages are compared as raw bytes: equal bytes mean equal
tokens, and bytes comparison and hashing run at C speed.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from .errors import ArgumentTypeError, ArgumentValueError, InvalidTokensError

TOKEN_DTYPE = np.dtype(np.uint32)
TOKEN_BYTES = TOKEN_DTYPE.itemsize
MAX_TOKEN = int(np.iinfo(TOKEN_DTYPE).max)

TokensLike = Union[Sequence[int], np.ndarray]

# Types np.asarray would take apart wrongly (into characters, or a 0-d object array).
_NOT_SEQUENCES = (str, bytes, bytearray, dict, set, frozenset)


def int_array(value: object, name: str, error: type = ValueError) -> np.ndarray:
    """Return ``value`` (a sequence of ints or an integer numpy array) as an integer numpy array.

    The shared front half of :func:`as_tokens` and block-id validation: it
    checks types only. Raises :class:`TypeError` naming ``name`` when
    ``value`` is not a sequence or array (``None``, a scalar, a ``str``,
    ``dict`` or ``set``) or holds non-integers (floats, bools, strings), and
    ``error`` (a ``ValueError`` subclass) for a ragged nesting or a Python int
    too large for int64. The result may have any shape (callers check it); an
    empty input gives an empty ``int64`` array. Cost: O(len(value)).
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, _NOT_SEQUENCES) or not hasattr(value, "__len__"):
        raise ArgumentTypeError(f"{name} must be a sequence of ints or a 1-D integer array, got {type(value).__name__}")
    elif len(value) == 0:
        return np.empty(0, dtype=np.int64)
    else:
        try:
            arr = np.asarray(value)
        except (ValueError, OverflowError) as exc:
            raise error(f"{name} is not a flat sequence of ints: {exc}") from None
        if arr.ndim == 0:  # an object numpy cannot see as a sequence (a mapping, ...)
            raise ArgumentTypeError(f"{name} must be a sequence of ints or a 1-D integer array, got {type(value).__name__}")
    if arr.dtype.kind in "iu":
        return arr
    if arr.size == 0:
        return np.empty(arr.shape, dtype=np.int64)
    if arr is not value:  # from Python objects: numpy turns ints past int64 mixed with others into floats
        arr = np.asarray(value, dtype=object)
    if arr.dtype == object:
        bad = [t for t in arr.flat if not is_int(t)][:1]
        if not bad:  # Python ints too large for int64
            raise error(f"{name} has a value outside the int64 range")
        raise ArgumentTypeError(f"{name} must hold ints, got {bad[0]!r} ({type(bad[0]).__name__})")
    raise ArgumentTypeError(f"{name} must hold ints, got dtype {arr.dtype}")


def as_tokens(tokens: TokensLike, name: str = "tokens") -> np.ndarray:
    """Return ``tokens`` as a contiguous 1-D ``uint32`` array, or raise.

    Accepts any sequence of ints or a 1-D integer numpy array. Raises
    :class:`TypeError` for a non-sequence (``None``, ``dict``, ``set``,
    ``str``, a scalar) or non-integer elements, and
    :class:`~radixkv.errors.InvalidTokensError` (a ``ValueError``) for wrong
    shape or values outside ``[0, 2**32)``. Cost: O(len(tokens)).
    """
    if isinstance(tokens, np.ndarray) and tokens.dtype == TOKEN_DTYPE and tokens.ndim == 1:
        return np.ascontiguousarray(tokens)
    arr = int_array(tokens, name, InvalidTokensError)
    if arr.ndim != 1:
        raise InvalidTokensError(f"{name} must be 1-D, got an array of shape {arr.shape}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > MAX_TOKEN:
            bad = lo if lo < 0 else hi
            raise InvalidTokensError(f"{name} must be in [0, {MAX_TOKEN}], got {bad!r}")
    return arr.astype(TOKEN_DTYPE)


def is_int(value: object) -> bool:
    """True for a Python or numpy integer, False for ``bool`` (and ``np.bool_``), floats and the rest. O(1)."""
    return value.__class__ is int or (isinstance(value, (int, np.integer)) and not isinstance(value, bool))


def check_namespace(namespace: object) -> None:
    """Raise unless ``namespace`` is ``None`` or a ``str`` that is valid Unicode text.

    A non-str is an :class:`~radixkv.errors.ArgumentTypeError`; a str holding a
    lone surrogate (``"\\ud800"``, which ``json.loads`` produces from an escaped
    half pair) an :class:`~radixkv.errors.ArgumentValueError`: it has no UTF-8
    encoding, so it could be neither hashed into a block hash (CBOR text) nor
    published in an event, and encoding it some other way would give the same
    namespace different bytes in different consumers. Refusing it here, before
    anything changes, keeps every namespace one string with one encoding. O(1)
    for ASCII, else O(len).
    """
    if namespace is None:
        return
    if type(namespace) is not str:
        raise ArgumentTypeError(f"namespace must be a str or None, got {namespace!r}")
    if not namespace.isascii():
        try:
            namespace.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ArgumentValueError(f"namespace must be valid Unicode text (UTF-8 encodable), got {namespace!r}: "
                                     f"{exc.reason} at index {exc.start}") from None


def check_positive_int(value: object, name: str, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int if it is a (non-negative or) positive integer, else raise.

    Python and numpy integers pass; ``bool`` and floats (even integral ones) raise
    :class:`TypeError`, out-of-range values :class:`ValueError`. O(1).
    """
    if not is_int(value):
        raise ArgumentTypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ArgumentValueError(f"{name} must be {bound}, got {value!r}")
    return value
