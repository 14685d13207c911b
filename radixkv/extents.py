"""Block ids as extents: runs of consecutive ids and ``int32`` segments, moved without expanding them.

A *part* is either a run ``(first, last)`` of consecutive ids, ascending or
descending, both ends included (``(7, 7)`` is one id; ``(9, 6)`` is 9, 8, 7, 6),
or a non-empty 1-D ``int32`` array of ids that form no long run. A sequence of
block ids is a tuple of parts, in order. At page size 1 a request's ~10^4
blocks are a handful of runs: splitting, truncating and handing them back as
runs costs O(parts) Python and no per-id work, where an id array costs an
``arange``, a copy and a run search per move. An array only exists when a
caller asks for one (:func:`to_array`).

Arrays inside parts are never written in place (whoever holds a tuple of parts
may rely on its ids staying what they were); :func:`to_array` returns a new
array.
"""

from __future__ import annotations

from itertools import chain
from typing import Iterable, List, Tuple, Union

import numpy as np

Part = Union[Tuple[int, int], np.ndarray]
Parts = Tuple[Part, ...]

ID_DTYPE = np.dtype(np.int32)
NONE: Parts = ()


def part_size(part: Part) -> int:
    """Ids in ``part``. O(1)."""
    if part.__class__ is tuple:
        first, last = part
        return last - first + 1 if last >= first else first - last + 1
    return len(part)


def size(parts: Parts) -> int:
    """Ids in ``parts``. O(parts)."""
    n = 0
    for part in parts:
        n += part_size(part)
    return n


def run_ids(first: int, last: int) -> np.ndarray:
    """The ids of run ``(first, last)`` as a new ``int32`` array. O(ids) C."""
    if last >= first:
        return np.arange(first, last + 1, dtype=ID_DTYPE)
    return np.arange(first, last - 1, -1, dtype=ID_DTYPE)


def to_array(parts: Parts) -> np.ndarray:
    """The ids of ``parts`` in order, as a new writable ``int32`` array. O(ids) C, O(parts) Python.

    Several parts are joined as bytes (about a third of ``np.concatenate``'s cost per part).
    """
    if len(parts) == 1:
        part = parts[0]
        return run_ids(*part) if part.__class__ is tuple else part.copy()
    pieces = [run_ids(*part) if part.__class__ is tuple else part for part in parts]
    if not pieces:
        return np.empty(0, dtype=ID_DTYPE)
    return np.frombuffer(bytearray().join(pieces), dtype=ID_DTYPE)


def join(groups: Iterable[Parts]) -> Parts:
    """One tuple of the parts of each tuple in ``groups``, in order. O(parts)."""
    return tuple(chain.from_iterable(groups))


def _cut_part(part: Part, i: int) -> Tuple[Part, Part]:
    """``part``'s first ``i`` ids and the rest (``0 < i < part_size(part)``)."""
    if part.__class__ is tuple:
        first, last = part
        step = 1 if last >= first else -1
        return (first, first + step * (i - 1)), (first + step * i, last)
    return part[:i], part[i:]


def cut(parts: Parts, keep: int) -> Tuple[Parts, Parts]:
    """``parts``' first ``keep`` ids and the rest, as two tuples of parts (array parts as views).

    ``0 <= keep <= size(parts)``. O(parts) Python, no per-id work.
    """
    if keep <= 0:
        return NONE, parts
    seen = 0
    for i, part in enumerate(parts):
        n = part_size(part)
        if seen + n >= keep:
            if seen + n == keep:
                return parts[: i + 1], parts[i + 1 :]
            lower, upper = _cut_part(part, keep - seen)
            return parts[:i] + (lower,), (upper,) + parts[i + 1 :]
        seen += n
    return parts, NONE


def cut_tail(parts: Parts, k: int) -> Tuple[Parts, Parts]:
    """``parts`` without its last ``k`` ids, and those ``k`` ids (``0 <= k <= size(parts)``).

    Walks from the end: O(parts holding the last ``k`` ids) Python, no per-id work.
    """
    if k <= 0:
        return parts, NONE
    seen = 0
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        n = part_size(part)
        if seen + n >= k:
            if seen + n == k:
                return parts[:i], parts[i:]
            lower, upper = _cut_part(part, n - (k - seen))
            return parts[:i] + (lower,), (upper,) + parts[i + 1 :]
        seen += n
    return NONE, parts


def id_list(parts: Parts) -> List[int]:
    """The ids of ``parts`` in order, as Python ints. O(ids); no numpy call for a run (cheaper
    than :func:`to_array` plus ``tolist`` when the caller works on ints anyway)."""
    out: List[int] = []
    for part in parts:
        if part.__class__ is tuple:
            first, last = part
            out.extend(range(first, last + 1) if last >= first else range(first, last - 1, -1))
        else:
            out.extend(part.tolist())
    return out


def last_id(parts: Parts) -> int:
    """The last id of non-empty ``parts``. O(1)."""
    part = parts[-1]
    return part[1] if part.__class__ is tuple else int(part[-1])


def check(parts: Parts) -> None:
    """Assert every part is well formed: a run of two ints, or a non-empty 1-D ``int32`` array."""
    assert parts.__class__ is tuple, f"parts must be a tuple, got {type(parts).__name__}"
    for part in parts:
        if part.__class__ is tuple:
            assert len(part) == 2 and all(v.__class__ is int and v >= 0 for v in part), f"bad run {part!r}"
        else:
            assert isinstance(part, np.ndarray) and part.dtype == ID_DTYPE and part.ndim == 1 and len(part), (
                f"bad id segment {part!r}")
