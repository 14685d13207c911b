"""A tiny decoder-only transformer in numpy, served with radixkv as its KV store.

The model is real enough to make the KV cache matter: random float32 weights,
a few layers of RMSNorm -> grouped-query attention with rotary position
embeddings -> SwiGLU MLP. The serving loop keeps K/V in radixkv pages:

1. ``match`` the longest cached page prefix of the prompt (in a
   :class:`~radixkv.tiers.TieredCache`, pages demoted to host memory are loaded
   back here) and ``lock`` it;
2. prefill computes K/V **only for the uncached tokens**, attending to the
   cached K/V read from the pages;
3. decode appends one token at a time to the request's own K/V;
4. the finished sequence's new full pages get blocks (evicting, or demoting to
   host, as needed), their K/V is written, and only then are they inserted,
   so a page is never served before its K/V is complete.

Over a multi-turn conversation with evictions, demotions and load-backs in
between, every logit equals a full recompute without the cache (max abs
difference far below 1e-5 in float32). Run it::

    python examples/tiny_llm.py

and it prints tokens/s with and without the cache.
"""

from __future__ import annotations

import argparse
import os
import time

# The matrices are tiny: BLAS threads cost more than they give (set before numpy loads).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from radixkv import PrefixCache
from radixkv.tiers import HostTier, TieredCache


# ---------------------------------------------------------------------------- model
@dataclass(frozen=True)
class Config:
    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 2  # grouped-query attention: 4 query heads share each K/V head
    head_dim: int = 16
    ffn_dim: int = 256
    rope_theta: float = 10000.0

    @property
    def kv_shape(self) -> Tuple[int, int, int, int]:
        """Per-token K/V: (layers, K and V, kv heads, head dim)."""
        return (self.num_layers, 2, self.num_kv_heads, self.head_dim)


class TinyLLM:
    """Decoder-only transformer with random weights. ``forward`` continues a sequence from cached K/V."""

    def __init__(self, config: Config = Config(), seed: int = 0) -> None:
        c = self.config = config
        rng = np.random.default_rng(seed)

        def w(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

        self.embed = rng.standard_normal((c.vocab_size, c.d_model)).astype(np.float32)
        self.layers = [
            dict(attn_norm=np.ones(c.d_model, np.float32), mlp_norm=np.ones(c.d_model, np.float32),
                 wq=w(c.d_model, c.num_heads * c.head_dim), wk=w(c.d_model, c.num_kv_heads * c.head_dim),
                 wv=w(c.d_model, c.num_kv_heads * c.head_dim), wo=w(c.num_heads * c.head_dim, c.d_model),
                 w_gate=w(c.d_model, c.ffn_dim), w_up=w(c.d_model, c.ffn_dim), w_down=w(c.ffn_dim, c.d_model))
            for _ in range(c.num_layers)
        ]
        self.final_norm = np.ones(c.d_model, np.float32)
        self.unembed = w(c.d_model, c.vocab_size)
        half = c.head_dim // 2
        self.inv_freq = (1.0 / c.rope_theta ** (np.arange(half, dtype=np.float64) / half))
        self.kv_group = np.repeat(np.arange(c.num_kv_heads), c.num_heads // c.num_kv_heads)

    @staticmethod
    def _rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6))) * weight

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotary embedding on ``x`` of shape (tokens, heads, head_dim) at ``positions``."""
        angles = positions[:, None].astype(np.float64) * self.inv_freq[None, :]
        cos = np.cos(angles).astype(np.float32)[:, None, :]
        sin = np.sin(angles).astype(np.float32)[:, None, :]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def forward(self, tokens: np.ndarray, past_kv: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Logits for ``tokens`` continuing a sequence whose earlier K/V is ``past_kv``.

        Args:
            tokens: the new tokens, shape (n,).
            past_kv: K/V of the tokens before them, shape (start, *kv_shape), or ``None``.

        Returns:
            (logits (n, vocab), the new tokens' K/V (n, *kv_shape)).
        """
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        start = 0 if past_kv is None else len(past_kv)
        positions = np.arange(start, start + n)
        new_kv = np.empty((n,) + c.kv_shape, dtype=np.float32)
        # query i (position start+i) may attend keys 0 .. start+i
        mask = np.arange(start + n)[None, :] > positions[:, None]
        scale = np.float32(1.0 / np.sqrt(c.head_dim))
        x = self.embed[tokens]
        for li, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer["attn_norm"])
            q = self._rope((h @ layer["wq"]).reshape(n, c.num_heads, c.head_dim), positions)
            k = self._rope((h @ layer["wk"]).reshape(n, c.num_kv_heads, c.head_dim), positions)
            v = (h @ layer["wv"]).reshape(n, c.num_kv_heads, c.head_dim)
            new_kv[:, li, 0], new_kv[:, li, 1] = k, v
            if past_kv is not None and start:
                k = np.concatenate([past_kv[:, li, 0], k])
                v = np.concatenate([past_kv[:, li, 1], v])
            k, v = k[:, self.kv_group], v[:, self.kv_group]  # GQA: each query head's K/V head
            scores = np.matmul(q.transpose(1, 0, 2), k.transpose(1, 2, 0)) * scale  # (heads, n, start+n)
            scores = np.where(mask[None], np.float32(-np.inf), scores)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = np.matmul(probs, v.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(n, c.num_heads * c.head_dim)
            x = x + attn @ layer["wo"]
            h = self._rms_norm(x, layer["mlp_norm"])
            gate = h @ layer["w_gate"]
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ layer["w_up"])) @ layer["w_down"]
        logits = self._rms_norm(x, self.final_norm) @ self.unembed
        return logits.astype(np.float32), new_kv


# ---------------------------------------------------------------------------- serving
@dataclass
class TurnResult:
    """One request: the generated tokens and the logits that chose them."""

    output: List[int]
    logits: np.ndarray        # (len(output), vocab): logits of each generated position
    hit_tokens: int           # prompt tokens whose K/V came from the cache
    computed_tokens: int      # prompt tokens whose K/V was computed in prefill


class Server:
    """Greedy generation with radixkv as the KV store (``cache=None``: no reuse across requests)."""

    def __init__(self, model: TinyLLM, cache: Optional[PrefixCache]) -> None:
        self.model = model
        self.cache = cache
        if cache is not None and cache.read([]).shape[2:] != model.config.kv_shape:
            raise ValueError(f"cache kv_shape must be {model.config.kv_shape}")

    def generate(self, prompt: List[int], max_new_tokens: int, namespace: Optional[str] = None) -> TurnResult:
        model, cache = self.model, self.cache
        kv_shape = model.config.kv_shape
        match = None
        past = np.empty((0,) + kv_shape, dtype=np.float32)
        if cache is not None:
            # Leave the last prompt token uncached: its logits start the generation.
            match = cache.match(prompt[:-1], namespace=namespace)
            cache.lock(match.node)
            if match.num_tokens:
                past = cache.read(match.blocks).reshape((-1,) + kv_shape)
        hit = len(past)
        logits, new_kv = model.forward(np.asarray(prompt[hit:]), past if hit else None)
        kv = np.concatenate([past, new_kv])
        out: List[int] = []
        rows = []
        step_logits = logits[-1]
        for i in range(max_new_tokens):
            rows.append(step_logits)
            out.append(int(np.argmax(step_logits)))
            if i + 1 < max_new_tokens:
                step, step_kv = model.forward(np.asarray(out[-1:]), kv)
                kv = np.concatenate([kv, step_kv])
                step_logits = step[-1]
        if cache is not None:
            self._store(prompt + out[:-1], kv, match, namespace)
        return TurnResult(out, np.stack(rows), hit, len(prompt) - hit)

    def _store(self, tokens: List[int], kv: np.ndarray, match, namespace: Optional[str]) -> None:
        """Cache the full pages of ``tokens`` (whose K/V is ``kv``) beyond the matched ones; unlock."""
        cache = self.cache
        page = cache.page_size
        have = match.num_tokens // page
        want = len(kv) // page - have
        room = cache.num_free_blocks + cache.evictable_blocks
        blocks = cache.allocate(min(want, room)) if want > 0 else None
        if blocks is not None and len(blocks):
            n = len(blocks)
            cache.write(blocks, kv[have * page : (have + n) * page].reshape((n, page) + kv.shape[1:]))
            cache.insert(tokens[: (have + n) * page], np.concatenate([match.blocks, blocks]), namespace=namespace)
        cache.unlock(match.node)


def conversations(num_conversations: int, turns: int, system_len: int, user_len: int, seed: int,
                  vocab_size: int) -> List[List[List[int]]]:
    """User messages: conversation -> turn -> tokens; every first message starts with a shared system prompt."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab_size, system_len).tolist()
    out = []
    for _ in range(num_conversations):
        msgs = [rng.integers(0, vocab_size, user_len).tolist() for _ in range(turns)]
        msgs[0] = system + msgs[0]
        out.append(msgs)
    return out


def serve(server: Server, messages: List[List[List[int]]], new_tokens: int,
          namespaces: Optional[List[Optional[str]]] = None) -> List[Tuple[List[int], TurnResult]]:
    """Run the conversations round-robin, turn by turn; returns (prompt, result) per request in order."""
    history = [[] for _ in messages]
    done = []
    for turn in range(max(len(m) for m in messages)):
        for c, msgs in enumerate(messages):
            if turn >= len(msgs):
                continue
            prompt = history[c] + msgs[turn]
            result = server.generate(prompt, new_tokens, namespace=namespaces[c] if namespaces else None)
            history[c] = prompt + result.output
            done.append((prompt, result))
    return done


def max_logit_diff(model: TinyLLM, runs: List[Tuple[List[int], TurnResult]]) -> float:
    """Largest |logit - full-recompute logit| over every generated position of every request."""
    worst = 0.0
    for prompt, result in runs:
        sequence = prompt + result.output[:-1]
        full, _ = model.forward(np.asarray(sequence))
        reference = full[len(prompt) - 1 :]
        worst = max(worst, float(np.max(np.abs(reference - result.logits))))
    return worst


def make_cache(config: Config, num_blocks: int, page_size: int, host_blocks: int) -> PrefixCache:
    """HBM of ``num_blocks`` pages; with ``host_blocks`` a write-back host tier that always loads back."""
    if host_blocks:
        return TieredCache(num_blocks, page_size, kv_shape=config.kv_shape, dtype="float32",
                           tiers=[HostTier(host_blocks)], write_policy="write_back", load_back="always",
                           enable_events=True)
    return PrefixCache(num_blocks, page_size, kv_shape=config.kv_shape, dtype="float32", enable_events=True)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=384)
    ap.add_argument("--user-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=64, help="HBM pages (small, to force evictions)")
    ap.add_argument("--host-blocks", type=int, default=64, help="host-tier pages (0: no tier)")
    args = ap.parse_args(argv)

    config = Config()
    model = TinyLLM(config)
    messages = conversations(args.conversations, args.turns, args.system_tokens, args.user_tokens, 0,
                             config.vocab_size)
    serve(Server(model, None), [m[:1] for m in messages[:1]], 2)  # warm up numpy

    rates = {}
    for label, cache in (("without cache", None),
                         ("with radixkv", make_cache(config, args.num_blocks, args.page_size, args.host_blocks))):
        server = Server(model, cache)
        t0 = time.perf_counter()
        runs = serve(server, messages, args.new_tokens)
        seconds = time.perf_counter() - t0
        served = sum(len(p) + len(r.output) for p, r in runs)
        computed = sum(r.computed_tokens for _, r in runs)
        generated = sum(len(r.output) for _, r in runs)
        rates[label] = served / seconds
        diff = max_logit_diff(model, runs)
        print(f"{label:14s}: {len(runs)} requests, {served} tokens served ({generated} generated) in "
              f"{seconds:.2f} s = {served / seconds:,.0f} tokens/s; prefill computed {computed} tokens; "
              f"max |logit - full recompute| = {diff:.2e}")
        if cache is not None:
            extra = ""
            if isinstance(cache, TieredCache):
                by_tier = cache.tier_stats().hit_tokens_by_tier
                extra = f", hit tokens by tier {by_tier}"
            print(f"{'':14s}  cache: {cache.evicted_blocks} pages evicted from HBM{extra}, "
                  f"{len(cache.take_events())} KV events")
    print(f"speed-up: {rates['with radixkv'] / rates['without cache']:.2f}x")


if __name__ == "__main__":
    main()
