"""The public API says what it raises: a ``Raises:`` section on every entry point an embedder or a
script calls, each naming a class of :mod:`radixkv.errors` (or a built-in) that exists."""

from __future__ import annotations

import re

import pytest

import radixkv
from radixkv import api, errors
from radixkv.workload.sources import open_trace

PUBLIC = [radixkv.PrefixCache, *(getattr(radixkv.PrefixCache, name) for name in (
    "match", "admit", "insert", "allocate", "free", "evict", "lock", "unlock", "pin", "unpin", "read", "write")),
    radixkv.api.Records.to_dataframe, api.replay, api.sweep, api.curve, open_trace]


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__qualname__)
def test_public_calls_have_a_raises_section_naming_real_errors(fn):
    doc = fn.__doc__ or ""
    assert "\nRaises:" in doc.replace("    ", ""), f"{fn.__qualname__} has no Raises: section"
    section = doc.split("Raises:", 1)[1]
    named = set(re.findall(r"\b([A-Z][A-Za-z]*Error)\b", section))
    assert named, f"{fn.__qualname__}'s Raises: names no error"
    for name in named:
        assert hasattr(errors, name) or hasattr(__builtins__, name) or name in dir(__import__("builtins")), name
