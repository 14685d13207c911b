"""Re-matching a growing request: a Python list converted whole each time vs a ``TokenBuffer``.

    .venv/bin/python bench/peers/token_growth.py [--limit 200] [--repeat 3] [--out bench/results/token_input.jsonl]

An engine matches a request again as it grows. Per prompt of the Mooncake
conversation trace (first ``--limit``, expanded as ``_common.MooncakeTrace``
does): a chunked prefill re-matches after every ``--chunk`` tokens, then
``--decode`` generated tokens arrive one at a time and the request is
re-matched at every page boundary; finally the request is admitted and
released (untimed), so later prompts find their prefixes cached. Two caches
replay the same steps side by side, step by step: one gets the engine's
growing Python list (``match(list)``), the other a ``TokenBuffer`` (the timed
step is ``extend``/``append`` plus ``match``). Reported: the total time of the
timed steps per form, fastest of ``--repeat`` runs, and their ratio.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common  # noqa: E402

from radixkv import PrefixCache, TokenBuffer  # noqa: E402

DECODE_BASE = 3_000_000_000  # generated token ids, apart from the trace's


def run(trace, page_size, num_blocks, chunk, decode):
    a, b = PrefixCache(num_blocks=num_blocks, page_size=page_size), PrefixCache(num_blocks=num_blocks, page_size=page_size)
    clock = time.perf_counter_ns
    spent = {"list": 0, "token_buffer": 0}
    steps = 0
    for prompt in trace:
        prompt = prompt.tolist()
        pieces = [prompt[i:i + chunk] for i in range(0, len(prompt), chunk)]
        pieces += [[DECODE_BASE + j] for j in range(decode)]
        held, buf = [], TokenBuffer()
        for k, piece in enumerate(pieces):
            held.extend(piece)  # the engine's own list grows either way
            t0 = clock()
            if len(piece) == 1:
                buf.append(piece[0])
            else:
                buf.extend(piece)
            if len(piece) > 1 or len(buf) % page_size == 0:
                hit_b = b.match(buf).num_tokens
            t1 = clock()
            if len(piece) > 1 or len(held) % page_size == 0:
                hit_a = a.match(held).num_tokens
                assert hit_a == hit_b
                steps += 1
            spent["list"] += clock() - t1
            spent["token_buffer"] += t1 - t0
        a.admit(held).release()
        b.admit(buf).release()
    return {form: ns / 1e9 for form, ns in spent.items()}, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=os.path.join(_common.TRACES, "mooncake_conversation.jsonl"))
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=187488)
    parser.add_argument("--tag", default=None)
    parser.add_argument("--out", default=None, help="append the JSON line to this file")
    args = parser.parse_args()
    trace = _common.MooncakeTrace(args.trace, args.limit)
    load_before = os.getloadavg()[0]
    runs = []
    for _ in range(args.repeat):
        gc.collect()
        seconds, steps = run(trace, args.page_size, args.num_blocks, args.chunk, args.decode)
        runs.append(seconds)
    best = {form: min(r[form] for r in runs) for form in runs[0]}
    row = {
        "scenario": "growing request", "trace": trace.name, "requests": len(trace), "chunk": args.chunk,
        "decode": args.decode, "matches": steps, "page_size": args.page_size, "num_blocks": args.num_blocks,
        "repeat": args.repeat, "seconds": {f: round(s, 4) for f, s in best.items()},
        "all_seconds": runs, "x_token_buffer": round(best["list"] / best["token_buffer"], 2),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "machine": _common.machine(),
    }
    _common.emit_row(row, args)


if __name__ == "__main__":
    main()
