"""Token validation and page keys.

Every public entry point funnels its ``tokens`` argument through
:func:`as_tokens`, so the rest of radixkv can assume a contiguous 1-D
``uint32`` array. Pages are compared as raw bytes: equal bytes mean equal
tokens, and bytes comparison and hashing run at C speed.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from .errors import InvalidTokensError

TOKEN_DTYPE = np.dtype(np.uint32)
TOKEN_BYTES = TOKEN_DTYPE.itemsize
MAX_TOKEN = int(np.iinfo(TOKEN_DTYPE).max)

TokensLike = Union[Sequence[int], np.ndarray]


def as_tokens(tokens: TokensLike, name: str = "tokens") -> np.ndarray:
    """Return ``tokens`` as a contiguous 1-D ``uint32`` array, or raise.

    Accepts any sequence of ints or a 1-D integer numpy array. Raises
    :class:`TypeError` for non-integer elements and
    :class:`~radixkv.errors.InvalidTokensError` (a ``ValueError``) for wrong
    shape or values outside ``[0, 2**32)``. Cost: O(len(tokens)).
    """
    if isinstance(tokens, np.ndarray):
        arr = tokens
    elif isinstance(tokens, (str, bytes, bytearray)) or not hasattr(tokens, "__len__"):
        raise TypeError(f"{name} must be a sequence of ints or a 1-D integer array, got {type(tokens).__name__}")
    elif len(tokens) == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    else:
        try:
            arr = np.asarray(tokens)
        except (ValueError, OverflowError) as exc:
            raise InvalidTokensError(f"{name} is not a flat sequence of ints: {exc}") from None
    if arr.ndim != 1:
        raise InvalidTokensError(f"{name} must be 1-D, got an array of shape {arr.shape}")
    if arr.dtype == TOKEN_DTYPE:
        return np.ascontiguousarray(arr)
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        if arr.size == 0:
            return np.empty(0, dtype=TOKEN_DTYPE)
        if arr.dtype == object:
            bad = next((t for t in arr if not isinstance(t, (int, np.integer)) or isinstance(t, bool)), None)
            if bad is None:  # Python ints too large for int64
                raise InvalidTokensError(f"{name} has a value outside [0, {MAX_TOKEN}]")
            raise TypeError(f"{name} must hold ints, got {bad!r} ({type(bad).__name__})")
        raise TypeError(f"{name} must hold ints, got dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > MAX_TOKEN:
            bad = lo if lo < 0 else hi
            raise InvalidTokensError(f"{name} must be in [0, {MAX_TOKEN}], got {bad!r}")
    return arr.astype(TOKEN_DTYPE)


def check_positive_int(value: object, name: str, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int if it is a (non-negative or) positive integer, else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return value
