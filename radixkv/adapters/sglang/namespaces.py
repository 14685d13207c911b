"""SGLang's (``extra_key``, ``cache_salt``) pair as a radixkv namespace, and back.

Layer: adapter keys; pure functions, no state.
"""

from __future__ import annotations

import json
from typing import Optional

from ...errors import ArgumentTypeError


def namespace_of(extra_key: Optional[str], cache_salt: Optional[str]) -> Optional[str]:
    """radixkv namespace of SGLang's (``extra_key``, ``cache_salt``) pair. O(len of both).

    What a router hashes as vLLM's ``cache_salt`` (``VLLMBlockView.block_hashes``)
    to find the pages this adapter cached for the pair.

    ``None`` (the default namespace) for ``(None, None)``; every other pair is
    ``json.dumps([extra_key, cache_salt])``, salted or not. One encoding for
    every pair makes the map injective by construction (``json.loads`` inverts
    it), so no ``extra_key`` text can spell another pair's namespace, as SGLang
    keeps them apart too; ``json.dumps`` escapes non-ASCII, so the namespace is
    always encodable. An empty ``cache_salt`` is no salt (SGLang's ``RadixKey``
    does the same); an empty ``extra_key`` is a key of its own, as in SGLang.
    Raises :class:`ArgumentTypeError` unless both are ``str`` or ``None``.
    """
    for name, value in (("extra_key", extra_key), ("cache_salt", cache_salt)):
        if value is not None and type(value) is not str:
            raise ArgumentTypeError(f"{name} must be a str or None, got {value!r}")
    if not cache_salt:
        if extra_key is None:
            return None
        cache_salt = None
    return json.dumps([extra_key, cache_salt])


def _cache_salt(namespace: Optional[str]) -> Optional[str]:
    """The ``cache_salt`` of a namespace made by :func:`namespace_of` (``None`` when unsalted or foreign)."""
    if namespace is None:
        return None
    try:
        pair = json.loads(namespace)
    except (TypeError, ValueError):  # a namespace given to the cache underneath directly
        return None
    if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str):
        return pair[1]
    return None

