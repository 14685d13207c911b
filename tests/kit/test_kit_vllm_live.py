"""The conformance kit's shipped vLLM target, driven against a real vLLM (``make test-vllm``).

Collected only where ``vllm`` is importable (tests/conftest.py).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase

from radixkv.testing import conformance_settings, run_conformance, targets


# Catching is what these tests measure; shrinking (minutes on a busy machine) is checked in test_testing_kit.py.
FIND = (Phase.explicit, Phase.generate)


def test_vllm_block_pool_passes():
    run_conformance(targets.vllm_block_pool(page_size=2, num_blocks=6), max_examples=300, database=None)


def test_touch_that_leaves_a_hit_block_in_the_free_queue_is_caught(monkeypatch):
    from vllm.v1.core.block_pool import BlockPool

    def broken_touch(self, blocks):
        for block in blocks:
            if not block.is_null:
                block.ref_cnt += 1  # the planted bug: a block with ref_cnt 0 stays in the free queue

    monkeypatch.setattr(BlockPool, "touch", broken_touch)
    with pytest.raises(AssertionError) as info:
        run_conformance(targets.vllm_block_pool(page_size=2, num_blocks=6),
                        settings=conformance_settings(500, derandomize=True, phases=FIND), database=None)
    assert "free queue" in str(info.value) or "locked pages were dropped" in str(info.value)
