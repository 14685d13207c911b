"""Hypothesis strategies for prefix-cache tests.

Token values come from a tiny alphabet so random sequences share prefixes,
split nodes and collide on whole pages often; that is where prefix caches break.
"""

from __future__ import annotations

from typing import Hashable, List, Optional, Sequence

from hypothesis import strategies as st


def token_lists(*, alphabet: int = 3, max_size: int = 12, min_size: int = 0) -> st.SearchStrategy[List[int]]:
    """Token sequences over ``range(alphabet)``, ``min_size..max_size`` long."""
    return st.lists(st.integers(0, alphabet - 1), min_size=min_size, max_size=max_size)


def page_aligned(page_size: int, *, alphabet: int = 3, max_pages: int = 4) -> st.SearchStrategy[List[int]]:
    """Token sequences of whole pages only (0..``max_pages`` pages)."""
    return st.integers(0, max_pages).flatmap(
        lambda n: st.lists(st.integers(0, alphabet - 1), min_size=n * page_size, max_size=n * page_size))


def namespaces(choices: Sequence[Optional[Hashable]] = (None, "a", "b")) -> st.SearchStrategy[Optional[Hashable]]:
    """A namespace from ``choices`` (``None`` is the default namespace)."""
    return st.sampled_from(list(choices))


def shared_prefix_pairs(*, alphabet: int = 3, max_size: int = 12) -> st.SearchStrategy:
    """Pairs of token lists that start with a common prefix and then may diverge."""
    return st.tuples(token_lists(alphabet=alphabet, max_size=max_size),
                     token_lists(alphabet=alphabet, max_size=max_size),
                     token_lists(alphabet=alphabet, max_size=max_size)).map(
        lambda t: (t[0] + t[1], t[0] + t[2]))


__all__ = ["namespaces", "page_aligned", "shared_prefix_pairs", "token_lists"]
