"""examples/tiny_llm.py: a numpy transformer served from radixkv pages gives the logits of a full recompute."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from radixkv import PrefixCache
from radixkv.tiers import TieredCache

_PATH = Path(__file__).resolve().parents[2] / "examples" / "tiny_llm.py"
_spec = importlib.util.spec_from_file_location("tiny_llm", _PATH)
tiny_llm = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("tiny_llm", tiny_llm)
_spec.loader.exec_module(tiny_llm)

CONFIG = tiny_llm.Config(vocab_size=64, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=16, ffn_dim=128)
PAGE = 8


@pytest.fixture(scope="module")
def model():
    return tiny_llm.TinyLLM(CONFIG, seed=1)


def _messages(conversations=3, turns=4, system=40, user=12):
    return tiny_llm.conversations(conversations, turns, system, user, seed=7, vocab_size=CONFIG.vocab_size)


def test_logits_equal_full_recompute_through_evictions_demotions_and_load_backs(model):
    cache = tiny_llm.make_cache(CONFIG, num_blocks=12, page_size=PAGE, host_blocks=12)
    assert isinstance(cache, TieredCache)
    cached = tiny_llm.serve(tiny_llm.Server(model, cache), _messages(), new_tokens=6)
    plain = tiny_llm.serve(tiny_llm.Server(model, None), _messages(), new_tokens=6)

    assert tiny_llm.max_logit_diff(model, cached) < 1e-5
    assert [r.output for _, r in cached] == [r.output for _, r in plain]  # same greedy tokens
    for (_, a), (_, b) in zip(cached, plain):
        assert np.max(np.abs(a.logits - b.logits)) < 1e-5
    # The run really went through the cache's hard paths.
    assert cache.evicted_blocks > 0
    by_tier = cache.tier_stats().hit_tokens_by_tier
    assert by_tier["hbm"] > 0 and by_tier["host"] > 0, by_tier
    assert sum(r.computed_tokens for _, r in cached) < sum(r.computed_tokens for _, r in plain) / 2
    cache.check()


def test_prefill_computes_kv_only_for_uncached_tokens(model, monkeypatch):
    calls = []
    forward = model.forward

    def recording(tokens, past_kv=None):
        calls.append((len(tokens), 0 if past_kv is None else len(past_kv)))
        return forward(tokens, past_kv)

    monkeypatch.setattr(model, "forward", recording)
    cache = tiny_llm.make_cache(CONFIG, num_blocks=64, page_size=PAGE, host_blocks=0)
    server = tiny_llm.Server(model, cache)
    first = server.generate(list(range(30)), 3)
    assert calls[0] == (30, 0) and first.hit_tokens == 0
    calls.clear()
    second = server.generate(list(range(30)) + first.output + [5, 6, 7], 3)
    # 30 prompt + 2 generated tokens had K/V: 4 full pages (32 tokens) are reused.
    assert second.hit_tokens == 32
    assert calls[0] == (len(range(30)) + 3 + 3 - 32, 32)
    assert all(n == 1 for n, _ in calls[1:])  # decode appends one token at a time


def test_namespaces_do_not_share_the_system_prompt(model):
    cache = tiny_llm.make_cache(CONFIG, num_blocks=64, page_size=PAGE, host_blocks=0)
    runs = tiny_llm.serve(tiny_llm.Server(model, cache), _messages(conversations=2, turns=1), 4,
                          namespaces=["tenant-a", "tenant-b"])
    assert [r.hit_tokens for _, r in runs] == [0, 0]  # same 40-token system prompt, different tenants
    runs = tiny_llm.serve(tiny_llm.Server(model, cache), _messages(conversations=2, turns=1), 4,
                          namespaces=["tenant-a", "tenant-a"])
    assert [r.hit_tokens for _, r in runs] == [48, 40]  # 1st: its own pages; 2nd: the shared system prompt
    assert tiny_llm.max_logit_diff(model, runs) < 1e-5


def test_a_corrupted_page_is_caught_by_the_comparison(model):
    """The full-recompute check is not vacuous: wrong K/V in one cached page shows in the logits."""
    cache = tiny_llm.make_cache(CONFIG, num_blocks=64, page_size=PAGE, host_blocks=0)
    server = tiny_llm.Server(model, cache)
    prompt = list(range(40))
    first = server.generate(prompt, 2)
    m = cache.match(prompt)
    cache.write(m.blocks[2:3], cache.read(m.blocks[2:3]) + np.float32(0.5))
    second = server.generate(prompt + first.output + [1, 2], 2)
    assert second.hit_tokens >= 24
    assert tiny_llm.max_logit_diff(model, [(prompt + first.output + [1, 2], second)]) > 1e-3


def test_server_rejects_a_cache_of_the_wrong_shape(model):
    with pytest.raises(ValueError, match="kv_shape"):
        tiny_llm.Server(model, PrefixCache(8, page_size=PAGE, kv_shape=(1, 2, 3), dtype="float32"))


def test_main_prints_both_rates(capsys):
    tiny_llm.main(["--conversations", "2", "--turns", "2", "--system-tokens", "32", "--user-tokens", "8",
                   "--new-tokens", "2", "--num-blocks", "8", "--host-blocks", "8", "--page-size", "8"])
    out = capsys.readouterr().out
    assert "without cache" in out and "with radixkv" in out and "tokens/s" in out and "speed-up" in out
