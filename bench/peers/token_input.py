"""radixkv's admit path with the same prompts in different token forms, alternating in one process.

    .venv/bin/python bench/peers/token_input.py [--limit 2000] [--repeat 5] [--out bench/results/token_input.jsonl]

Runs in the repository's venv (no SGLang or vLLM needed). The prompts are the
first ``--limit`` requests of the Mooncake conversation trace, expanded as
``_common.MooncakeTrace`` does for the peer drivers (``int64`` numpy arrays),
and handed to ``drive_radixkv.replay_radixkv`` as:

- ``numpy``: ``uint32`` arrays (what ``compare.py`` gives radixkv),
- ``numpy_int64``: the ``int64`` arrays as expanded,
- ``list``: Python lists of ints (what vLLM's ``Request.prompt_token_ids`` holds),
- ``array_q``: ``array('q')`` (what SGLang's ``Req`` holds).

Each form is built per request outside the timed region. Each repetition runs
every form (rotating who goes first) with a fresh cache, so load on the shared
machine hits all forms alike. Reported per form: the fastest repetition's time
in the cache calls, and the sum over requests of each request's fastest time
across repetitions (``min_sum_seconds``: every repetition does the same work per
request, so this drops the requests another process preempted; the ratio
``x_numpy`` is taken on it). The row also gives ``as_tokens`` alone on a
13.7k-token prompt (the trace's mean length) in each form, best of 3x200 calls.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import timeit
from array import array

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common  # noqa: E402
from drive_radixkv import replay_radixkv  # noqa: E402

from radixkv.keys import as_tokens  # noqa: E402

MEAN_PROMPT_TOKENS = 13700


def _array_q(p: np.ndarray) -> array:
    out = array("q")
    out.frombytes(p.astype(np.int64).tobytes())
    return out


FORMS = {
    "numpy": lambda p: p.astype(np.uint32),
    "numpy_int64": lambda p: p,
    "list": lambda p: p.tolist(),
    "array_q": _array_q,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=os.path.join(_common.TRACES, "mooncake_conversation.jsonl"))
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=187488)
    parser.add_argument("--forms", nargs="+", default=list(FORMS))
    parser.add_argument("--tag", default=None, help="free-form label stored in the JSON line")
    parser.add_argument("--out", default=None, help="append the JSON line to this file")
    args = parser.parse_args()
    trace = _common.MooncakeTrace(args.trace, args.limit)
    load_before = os.getloadavg()[0]
    runs = {form: [] for form in args.forms}
    min_ns = {form: None for form in args.forms}
    for rep in range(args.repeat):
        k = rep % len(args.forms)
        for form in args.forms[k:] + args.forms[:k]:
            make = FORMS[form]
            ns = []
            gc.collect()
            runs[form].append(replay_radixkv((make(p) for p in trace), args.page_size, args.num_blocks, ns))
            ns = np.asarray(ns, dtype=np.int64)
            min_ns[form] = ns if min_ns[form] is None else np.minimum(min_ns[form], ns)
    best = {form: min(rs, key=lambda r: r["cache_seconds"]) for form, rs in runs.items()}
    min_sum = {form: float(ns.sum()) / 1e9 for form, ns in min_ns.items()}
    prompt = np.resize(trace.expand(0), MEAN_PROMPT_TOKENS)  # the first prompt, repeated to the mean length
    convert_us = {}
    for form in args.forms:
        tokens = FORMS[form](prompt)
        convert_us[form] = round(min(timeit.repeat(lambda: as_tokens(tokens), number=200, repeat=3)) / 200 * 1e6, 1)
    base = min_sum.get("numpy", next(iter(min_sum.values())))
    row = {
        "trace": trace.name, "requests": best[args.forms[0]]["requests"], "num_blocks": args.num_blocks,
        "page_size": args.page_size, "repeat": args.repeat,
        "forms": {form: {"cache_seconds": b["cache_seconds"],
                         "all_cache_seconds": [r["cache_seconds"] for r in runs[form]],
                         "min_sum_seconds": round(min_sum[form], 4),
                         "x_numpy": round(min_sum[form] / base, 2),
                         "per_request_us": b["per_request_us"], "hit_tokens": b["hit_tokens"]}
                  for form, b in best.items()},
        "as_tokens_us": {"tokens": MEAN_PROMPT_TOKENS, **convert_us},
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "machine": _common.machine(),
    }
    hits = {b["hit_tokens"] for b in best.values()}
    assert len(hits) == 1, f"forms disagree on hit tokens: {hits}"
    _common.emit_row(row, args)


if __name__ == "__main__":
    main()
