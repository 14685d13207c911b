"""Token validation and page keys.

Every public entry point funnels its ``tokens`` argument through
:func:`as_tokens`, so the rest of radixkv can assume a contiguous 1-D
``uint32`` array. Pages are compared as raw bytes: equal bytes mean equal
tokens, and bytes comparison and hashing run at C speed.
"""

from __future__ import annotations

import array
import operator
from collections.abc import Mapping
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from .errors import ArgumentTypeError, ArgumentValueError, InvalidTokensError

TOKEN_DTYPE = np.dtype(np.uint32)
TOKEN_BYTES = TOKEN_DTYPE.itemsize
MAX_TOKEN = int(np.iinfo(TOKEN_DTYPE).max)

TokensLike = Union[Sequence[int], np.ndarray, array.array]

# Types that have a length but are not token sequences (np.asarray would take them
# apart into characters, or wrap them in a 0-d object array).
_NOT_SEQUENCES = (str, bytes, bytearray, dict, set, frozenset)
_BOOLS = (bool, np.bool_)
_U32_BOUND = 2**32
# The array typecode of a 4-byte unsigned int (C unsigned int: 4 bytes wherever CPython runs).
_U32_CODE = "I"
assert array.array(_U32_CODE).itemsize == TOKEN_BYTES
_INT_CODES = frozenset("bBhHiIlLqQ")
_max, _min = np.maximum.reduce, np.minimum.reduce
_I64, _U64 = np.dtype(np.int64), np.dtype(np.uint64)
_INT64_CODES = frozenset(code for code in "lq" if array.array(code).itemsize == 8)


def _casts_same_value() -> bool:
    """Whether numpy checks a narrowing cast in the cast itself (``casting="same_value"``, numpy 2.4)."""
    try:
        np.array([1], dtype=np.int64).astype(TOKEN_DTYPE, casting="same_value")
    except (TypeError, ValueError):
        return False
    try:
        np.array([-1], dtype=np.int64).astype(TOKEN_DTYPE, casting="same_value")
    except ValueError:
        return True
    return False  # (a numpy that took the word but did not check)


_SAME_VALUE = _casts_same_value()


def _narrow_int64(arr: np.ndarray) -> Optional[np.ndarray]:
    """Native ``int64`` ``arr`` (1-D) as a new ``uint32`` array if every token is in ``[0, 2**32)``,
    else ``None``. One pass where numpy checks the cast itself; else a range pass (seen as
    unsigned, a negative is >= 2**63: both ends at once) and the cast. O(len(arr)) at C speed."""
    if _SAME_VALUE:
        try:
            return arr.astype(TOKEN_DTYPE, casting="same_value")
        except ValueError:
            return None
    if len(arr) and _max(arr.view(_U64)) >= _U32_BOUND:
        return None
    return arr.astype(TOKEN_DTYPE)


def uint32_array(value: object, name: str, error: type = ArgumentValueError, bound: int = _U32_BOUND) -> np.ndarray:
    """Return ``value`` as a 1-D ``uint32`` numpy array of integers in ``[0, bound)``, or raise.

    The one validation rule for tokens and block ids, whatever form they come in:
    a list, tuple or other sequence, ``range``, ``array.array``, or a numpy array
    of any integer dtype (or of object dtype holding ints). An element is an
    integer when :func:`operator.index` takes it (``int``, numpy integers) and
    it is no ``bool``/``np.bool_``. Checked in this order, and the first
    offending element (with its position) is named:

    - not a sequence (``None``, a scalar, ``str``, ``bytes``, ``dict``, ``set``):
      :class:`~radixkv.errors.ArgumentTypeError`;
    - not 1-D (an array of another shape, or an element that is itself a
      sequence): ``error``;
    - an element that is not an integer (``bool``, ``float``, ``str``, ...):
      :class:`~radixkv.errors.ArgumentTypeError`;
    - an integer outside ``[0, bound)``: ``error`` (a ``ValueError`` subclass).

    An empty input gives an empty array (an empty float array too: it holds no
    float). Cost: O(len(value)) at C speed for numpy arrays, ``array.array``,
    ``range`` and lists or tuples of ints (converted by ``array.array``, which
    checks the range on the way); only a rejected input, or a list holding many
    0s and 1s (each is checked for being a ``bool``), walks elements in Python.
    The result may share memory with ``value`` when that is a contiguous
    ``uint32`` array.
    """
    if isinstance(value, np.ndarray):
        return _from_ndarray(value, name, error, bound)
    if isinstance(value, array.array):
        if value.typecode in _INT_CODES:
            return _from_ndarray(np.frombuffer(value, dtype=value.typecode), name, error, bound)
        if len(value):
            _raise_first_bad(value, name, error, bound)
        return np.empty(0, dtype=TOKEN_DTYPE)
    if isinstance(value, range):
        return _from_range(value, name, error, bound)
    if value.__class__ is list or value.__class__ is tuple:
        return _from_sequence(value, name, error, bound)
    if isinstance(value, (_NOT_SEQUENCES, Mapping, np.generic)):
        pass  # a numpy scalar has __array__, but is no sequence
    elif hasattr(value, "__array__"):  # a torch tensor, ...: numpy sees its dtype
        return _from_ndarray(np.asarray(value), name, error, bound)
    elif hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        return _from_sequence(value, name, error, bound)
    raise ArgumentTypeError(f"{name} must be a sequence of ints or a 1-D integer array, got {type(value).__name__}")


def _from_sequence(items: Sequence, name: str, error: type, bound: int) -> np.ndarray:
    """A list, tuple or other sequence of Python objects; see :func:`uint32_array`."""
    if len(items) == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    try:
        # array.array converts ints (and anything with __index__) at C speed and raises
        # OverflowError outside [0, 2**32) and TypeError for floats, strings, sequences.
        # fromlist reads a list's items without taking references: ~30% faster than array(code, list).
        if items.__class__ is list:
            buf = array.array(_U32_CODE)
            buf.fromlist(items)
        else:
            buf = array.array(_U32_CODE, items)
    except (TypeError, ValueError, OverflowError) as exc:
        _raise_first_bad(items, name, error, bound)
        raise error(f"{name} is not a sequence of ints: {exc}") from None
    arr = np.frombuffer(buf, dtype=TOKEN_DTYPE)
    # A bool went in as 0 or 1: only those positions can hold one.
    small = (arr < 2).nonzero()[0]
    if len(small) and any(items[i].__class__ is bool for i in small.tolist()):
        _raise_first_bad(items, name, error, bound)
    if bound < _U32_BOUND and len(arr) and int(arr.max()) >= bound:
        _raise_out_of_range(arr, name, error, bound)
    return arr


def _from_ndarray(arr: np.ndarray, name: str, error: type, bound: int) -> np.ndarray:
    """A numpy array; see :func:`uint32_array`."""
    if arr.ndim != 1:
        raise error(f"{name} must be 1-D, got an array of shape {arr.shape}")
    if arr.dtype.char in "qQ":
        # C long long (array('q')): numpy gives it type numbers of its own, distinct from
        # (u)int64 on LP64 systems, whose loops run ~1.6x faster in numpy 2.4; same bytes.
        arr = arr.view(arr.dtype.str)
    if arr.dtype == _I64 and bound == _U32_BOUND:
        # The engines' form (SGLang's array('q'), vLLM's and torch's int64): the general path
        # below gives the same verdict for ~5 us more per call.
        narrow = _narrow_int64(arr)
        if narrow is None:
            _raise_out_of_range(arr, name, error, bound)
        return narrow
    kind = arr.dtype.kind
    if kind == "u" or kind == "i":
        bits = 8 * arr.dtype.itemsize
        if kind == "u" and 2**bits <= bound:  # uint8/16/32 tokens: in range by their dtype
            bad = False
        elif kind == "i" and 2 ** (bits - 1) >= bound:
            # Seen as unsigned, a negative is >= 2**(bits-1) >= bound: one pass checks both ends.
            bad = arr.size and _max(arr.view(arr.dtype.str.replace("i", "u"))).item() >= bound
        else:
            bad = arr.size and (_min(arr).item() < 0 or _max(arr).item() >= bound)
        if bad:
            _raise_out_of_range(arr, name, error, bound)
        if arr.dtype == TOKEN_DTYPE:
            return np.ascontiguousarray(arr)
        return arr.astype(TOKEN_DTYPE)  # a contiguous copy; faster than ascontiguousarray(dtype=)
    if arr.size == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    if kind == "O":
        return _from_sequence(arr.tolist(), name, error, bound)
    raise ArgumentTypeError(f"{name} must hold ints, got dtype {arr.dtype} ({_short(arr[0].item())} at position 0)")


def _from_range(r: range, name: str, error: type, bound: int) -> np.ndarray:
    """A ``range``: its first out-of-range position is found in O(1), its array built by numpy."""
    if r.step > 0:
        bad = 0 if r.start < 0 else len(range(r.start, bound, r.step))
    else:
        bad = 0 if r.start >= bound else len(range(r.start, -1, r.step))
    if bad < len(r):
        raise error(f"{name} must be in [0, {bound}), got {r[bad]!r} at position {bad}")
    return np.arange(r.start, r.stop, r.step, dtype=np.int64).astype(TOKEN_DTYPE)


def _raise_out_of_range(arr: np.ndarray, name: str, error: type, bound: int) -> None:
    """Raise ``error`` naming the first element of the integer array ``arr`` outside ``[0, bound)``."""
    i = int(np.flatnonzero((arr < 0) | (arr >= bound))[0])
    raise error(f"{name} must be in [0, {bound}), got {arr[i].item()!r} at position {i}")


def _index(item: object) -> Optional[int]:
    """``item`` as an int if it is an integer and no bool, else None."""
    if isinstance(item, _BOOLS):
        return None
    try:
        return operator.index(item)
    except TypeError:
        return None


def _is_sequence(item: object) -> bool:
    if isinstance(item, np.ndarray):
        return item.ndim > 0
    return hasattr(item, "__len__") and not isinstance(item, _NOT_SEQUENCES)


def _raise_first_bad(items: Sequence, name: str, error: type, bound: int) -> None:
    """Raise for the first element of ``items`` that breaks :func:`uint32_array`'s rule, in its order.

    The slow, exact walk every form of input shares, so each gets the same
    verdict and message; returns only when every element is fine. O(len(items)).
    """
    values = [_index(item) for item in items]
    for i, (item, value) in enumerate(zip(items, values)):
        if value is None and _is_sequence(item):
            raise error(f"{name} must be 1-D, got a sequence at position {i}: {_short(item)}")
    for i, (item, value) in enumerate(zip(items, values)):
        if value is None:
            raise ArgumentTypeError(f"{name} must hold ints, got {_short(item)} ({_type_name(item)}) at position {i}")
    for i, value in enumerate(values):
        if not 0 <= value < bound:
            raise error(f"{name} must be in [0, {bound}), got {value!r} at position {i}")


def _type_name(item: object) -> str:
    cls = type(item)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"


def _short(item: object) -> str:
    text = repr(item)
    return text if len(text) <= 60 else text[:57] + "..."


def as_tokens(tokens: TokensLike, name: str = "tokens") -> np.ndarray:
    """Return ``tokens`` as a contiguous 1-D ``uint32`` array, or raise.

    Accepts a list, tuple, ``range``, ``array.array`` or other sequence of ints,
    or a 1-D numpy array of any integer dtype (or object dtype holding ints).
    Raises :class:`~radixkv.errors.ArgumentTypeError` for a non-sequence
    (``None``, ``dict``, ``set``, ``str``, a scalar) or a non-integer element
    (``bool``, ``np.bool_``, ``float``), and
    :class:`~radixkv.errors.InvalidTokensError` (an
    :class:`~radixkv.errors.ArgumentValueError`) for a wrong shape or a value
    outside ``[0, 2**32)``, naming the first bad element and its position (the
    rule is :func:`uint32_array`'s). Cost: O(1) for a contiguous ``uint32``
    array or a :class:`~radixkv.token_buffer.TokenBuffer` (returned as they
    are), O(len(tokens)) at C speed for other integer arrays and
    ``array.array``, and for a list about what ``sum(list)`` costs (CPython
    unboxes every int; a fifth of what ``numpy.asarray`` took).
    """
    cls = tokens.__class__
    if cls is np.ndarray and tokens.dtype == TOKEN_DTYPE and tokens.ndim == 1:
        return np.ascontiguousarray(tokens)
    if cls is array.array and tokens.typecode in _INT64_CODES:  # SGLang's array('q'): the short way
        narrow = _narrow_int64(np.frombuffer(tokens, _I64))
        if narrow is not None:
            return narrow
    return uint32_array(tokens, name, InvalidTokensError)


def page_key(tokens: TokensLike, page_size: int, name: str = "tokens") -> Tuple[bytes, int]:
    """The key of ``tokens``' whole pages and their number: ``(bytes, num_pages)``, the bytes those of
    :func:`as_tokens` (``uint32``) for the first ``num_pages * page_size`` tokens; raises as it does.

    Cost: :func:`as_tokens` (for ``array('q')``, SGLang's requests, one pass that checks and
    narrows the ``int64`` tokens where numpy can: ``casting="same_value"``, numpy 2.4) and one
    copy of the pages' tokens into the key.
    """
    arr = as_tokens(tokens, name)
    num_pages = len(arr) // page_size
    return arr[: num_pages * page_size].tobytes(), num_pages


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


def check_int(value: object, name: str, *, minimum: int = 0, maximum: Optional[int] = None,
              bound: Optional[str] = None, type_error: type = ArgumentTypeError,
              value_error: type = ArgumentValueError) -> int:
    """Return ``value`` as an int if it is an integer in ``[minimum, maximum]``, else raise: the one integer rule.

    Every count, size and index radixkv takes as an argument goes through here,
    so a Python or numpy integer passes everywhere and ``bool`` and floats (even
    integral ones) fail everywhere, as :func:`is_int` says. A non-integer raises
    ``type_error`` (:class:`~radixkv.errors.ArgumentTypeError` unless the caller
    names its own subclass), a value outside the bounds raises ``value_error``
    (:class:`~radixkv.errors.ArgumentValueError` by default), both naming
    ``name`` and the value; ``bound`` is how the message states the bounds
    (``">= minimum"`` or ``"in [minimum, maximum]"`` unless given). O(1).
    """
    if not is_int(value):
        raise type_error(f"{name} must be an int, got {value!r}")
    number = int(value)  # type: ignore[call-overload]
    if number < minimum or (maximum is not None and number > maximum):
        if bound is None:
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise value_error(f"{name} must be {bound}, got {number!r}")
    return number


def check_positive_int(value: object, name: str, *, allow_zero: bool = False,
                       value_error: type = ArgumentValueError) -> int:
    """Return ``value`` as an int if it is a (non-negative or) positive integer, else raise.

    :func:`check_int` with ``minimum`` 1 (0 when ``allow_zero``): ``bool`` and
    floats raise :class:`TypeError`, out-of-range values ``value_error`` (a
    :class:`ValueError`). O(1).
    """
    if allow_zero:
        return check_int(value, name, minimum=0, value_error=value_error)
    return check_int(value, name, minimum=1, bound="> 0", value_error=value_error)
