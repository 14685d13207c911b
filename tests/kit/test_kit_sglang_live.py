"""The conformance kit's shipped SGLang targets, driven against a real SGLang (``make test-sglang``).

Collected only where ``sglang`` is importable (tests/conftest.py). Each target
must pass as SGLang is and catch a bug planted in it (by monkeypatching) within
500 examples with no example database; the catching runs are derandomized so
they do not depend on a lucky seed.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase

from ..adapters.test_adapters_sglang import FakeEngine  # noqa: F401  (first: installs the torchvision stand-in SGLang imports)

from radixkv.testing import conformance_settings, run_conformance  # noqa: E402
from radixkv.testing import targets  # noqa: E402

PASSING_EXAMPLES = 300
CATCH_WITHIN = 500


@pytest.mark.parametrize("make", [targets.sglang_radix_cache, targets.sglang_unified_radix_cache])
def test_sglang_target_passes(make):
    run_conformance(make(page_size=2, num_blocks=6), max_examples=PASSING_EXAMPLES, database=None)


def _caught(target) -> str:
    with pytest.raises(AssertionError) as info:
        run_conformance(target, settings=conformance_settings(CATCH_WITHIN, derandomize=True, phases=FIND), database=None)
    return str(info.value)


# Catching is what these tests measure; shrinking (minutes on a busy machine) is checked in test_testing_kit.py.
FIND = (Phase.explicit, Phase.generate)


def test_split_that_drops_the_childs_lock_ref_is_caught(monkeypatch):
    from sglang.srt.mem_cache.radix_cache import RadixCache

    split = RadixCache._split_node

    def broken_split(self, key, child, split_len):
        new_node = split(self, key, child, split_len)
        new_node.lock_ref = 0  # the planted bug: the new parent forgets the locks below it
        return new_node

    monkeypatch.setattr(RadixCache, "_split_node", broken_split)
    # Seen as the lock count itself, or as the pages it then leaves unaccounted for.
    error = _caught(targets.sglang_radix_cache(page_size=2, num_blocks=6))
    assert "lock_ref" in error or "returned None" in error, error


def test_dropped_duplicate_slot_frees_are_caught(monkeypatch):
    monkeypatch.setattr(targets, "free_duplicates", lambda *args: [])
    assert "leaked" in _caught(targets.sglang_radix_cache(page_size=2, num_blocks=6))
