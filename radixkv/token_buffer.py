"""A growing request's tokens, converted once.

Engines match a request again as it grows: after each chunk of a chunked
prefill, during decode, at each turn of a conversation. Passing the whole
Python list each time makes radixkv convert (and validate) every token again,
which costs far more than the tree walk. A :class:`TokenBuffer` validates and
converts each token once, when it is appended, and is accepted wherever tokens
are: it hands numpy its ``uint32`` array (``__array__``), so
:func:`~radixkv.keys.as_tokens` takes it in O(1).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import ArgumentValueError, InvalidTokensError
from .keys import MAX_TOKEN, TOKEN_DTYPE, TokensLike, as_tokens, check_positive_int, uint32_array


class TokenBuffer:
    """Token ids that only grow (or are cut back), kept as a validated ``uint32`` array.

    >>> from radixkv import PrefixCache
    >>> cache = PrefixCache(num_blocks=8, page_size=2)
    >>> request = TokenBuffer([5, 6, 7])
    >>> cache.admit(request).release()
    >>> request.extend([8, 9]); request.append(10)
    >>> cache.match(request).num_tokens, len(request)
    (2, 6)

    Every array it has handed out stays as it was: appending writes past them,
    and :meth:`truncate` copies the kept prefix to new storage. Not thread-safe.
    """

    __slots__ = ("_data", "_len")

    def __init__(self, tokens: TokensLike = (), *, capacity: int = 0) -> None:
        """Hold ``tokens`` (validated as :func:`~radixkv.keys.as_tokens` does), with room for ``capacity``."""
        capacity = check_positive_int(capacity, "capacity", allow_zero=True)
        arr = as_tokens(tokens)
        self._data = np.empty(max(capacity, len(arr), 16), dtype=TOKEN_DTYPE)
        self._data[: len(arr)] = arr
        self._len = len(arr)

    def extend(self, tokens: TokensLike) -> None:
        """Append ``tokens``; raises as :func:`~radixkv.keys.as_tokens` (nothing appended). O(len(tokens)) amortized."""
        arr = as_tokens(tokens)
        end = self._len + len(arr)
        if end > len(self._data):
            self._grow(end)
        self._data[self._len: end] = arr
        self._len = end

    def append(self, token: int) -> None:
        """Append one token id (an int in ``[0, 2**32)``, no ``bool``). O(1) amortized."""
        if token.__class__ is not int or not 0 <= token <= MAX_TOKEN:
            token = int(uint32_array([token], "token", InvalidTokensError)[0])
        if self._len == len(self._data):
            self._grow(self._len + 1)
        self._data[self._len] = token
        self._len += 1

    def truncate(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens (rejected draft tokens, a rolled-back turn). O(num_tokens)."""
        num_tokens = check_positive_int(num_tokens, "num_tokens", allow_zero=True)
        if num_tokens > self._len:
            raise ArgumentValueError(f"num_tokens must be <= {self._len} (the buffer's length), got {num_tokens}")
        # New storage: arrays handed out before must not see the tokens appended next.
        self._data = self._data[: max(num_tokens * 2, 16)].copy()
        self._len = num_tokens

    def tokens(self) -> np.ndarray:
        """The tokens as a read-only 1-D ``uint32`` array (a view, no copy). O(1)."""
        view = self._data[: self._len]
        view.flags.writeable = False
        return view

    def __array__(self, dtype: Optional[object] = None, copy: Optional[bool] = None) -> np.ndarray:
        view = self.tokens()
        if dtype is not None and np.dtype(dtype) != TOKEN_DTYPE:
            return view.astype(dtype)
        return view.copy() if copy else view

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"TokenBuffer({self.tokens().tolist()!r})" if self._len <= 8 else f"TokenBuffer(<{self._len} tokens>)"

    def _grow(self, need: int) -> None:
        data = np.empty(max(need, 2 * len(self._data)), dtype=TOKEN_DTYPE)
        data[: self._len] = self._data[: self._len]
        self._data = data
