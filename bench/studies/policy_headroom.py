"""What would a policy have to know to close a quarter of the LRU-to-Belady gap? A knowledge ladder.

    python bench/studies/policy_headroom.py [--traces conversation,synthetic] [--num-tokens 3000000]
                                    [--out bench/results/policy_headroom]

Replays the Mooncake traces at the granularity of their 512-token blocks
(radixkv's replay semantics at page 512: the longest cached prefix hits, the
new full blocks are cached, the request's own blocks are protected, the
partial last block is never cached) through *deadline* policies: a block is
ranked at each use by ``last use + window(class)``, earliest deadline evicted
first, deepest first on ties. Windows are in requests. Each rung of the
ladder gives the class more knowledge:

1. ``uses``: how many times the block has been used, counting uses that
   missed (an online policy knows this only through a perfect history of
   evicted pages, so this is optimistic for one).
2. ``uses + request``: also the request's output length (known when it
   finishes) and size.
3. ``+ first-use oracle``: whether a block on its first use will ever be
   used again (a session that will send another turn). Needs the future.
4. ``+ session-end oracle``: whether any block will ever be used again.
   Needs the future.

Every rung takes the best of a small grid of windows, tuned on the very trace
it is scored on (in the policy's favour). The LRU rung is checked against
radixkv's own replay at page 512 (the script exits 1 if the hit tokens
differ); the Belady row is radixkv's ``belady`` policy at page 512.
The result says which knowledge the 25%-of-the-gap target needs: a policy
that only sees the past is bounded by rungs 1-2.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import sys
from typing import Callable, Dict, List, Sequence, Tuple

from radixkv import PrefixCache
from radixkv.analysis.replay import replay
from radixkv.workload.traces import TraceReader

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "..", "shared", "traces")
BLOCK = 512
NEVER = 1 << 40
LONG = 1 << 30  # a window no block outlives

Rank = Callable[[int, int, int], int]  # (request index, block position, block id) -> deadline


class Trace:
    """The trace's block lists with, per use, the true use count and the next use (for oracles)."""

    def __init__(self, path: str) -> None:
        rows = [json.loads(line) for line in open(path)]
        self.ids: List[List[int]] = [r["hash_ids"][: r["input_length"] // BLOCK] for r in rows]  # cacheable
        self.lengths = [r["input_length"] for r in rows]
        self.outputs = [r["output_length"] for r in rows]
        seen: Dict[int, int] = {}
        self.uses = []
        for ids in self.ids:
            self.uses.append([seen.get(b, 0) + 1 for b in ids])
            for b in ids:
                seen[b] = seen.get(b, 0) + 1
        nxt: Dict[int, int] = {}
        self.next_use: List[List[int]] = [[]] * len(rows)
        for i in range(len(rows) - 1, -1, -1):
            self.next_use[i] = [nxt.get(b, NEVER) for b in self.ids[i]]
            for b in self.ids[i]:
                nxt[b] = i


def simulate(trace: Trace, capacity: int, rank: Rank) -> int:
    """Hit tokens of a replay through ``capacity`` blocks ranked by ``rank`` (lazy heap of leaves)."""
    parent: Dict[int, int] = {}
    children: Dict[int, int] = {}
    depth: Dict[int, int] = {}
    key: Dict[int, Tuple[int, int, int]] = {}  # live heap entry per evictable leaf
    heap: List[Tuple[int, int, int, int]] = []
    stamp = itertools.count()
    hits = 0

    def enqueue(b: int, deadline: int) -> None:
        entry = (deadline, -depth[b], next(stamp), b)
        key[b] = entry[:3]
        heapq.heappush(heap, entry)

    deadlines: Dict[int, int] = {}
    for i, ids in enumerate(trace.ids):
        h = 0
        while h < len(ids) and ids[h] in depth:
            h += 1
        hits += h * BLOCK
        mine = set(ids)
        for k in range(h):  # the hit prefix is used now
            b = ids[k]
            deadlines[b] = rank(i, k, b)
            key.pop(b, None)
        held = []
        for k in range(h, len(ids)):
            while len(depth) >= capacity:
                while heap:
                    entry = heapq.heappop(heap)
                    b = entry[3]
                    if key.get(b) != entry[:3]:
                        continue
                    if b in mine:
                        held.append(entry)
                        continue
                    del key[b], depth[b], deadlines[b]
                    p = parent.pop(b)
                    if p >= 0:
                        children[p] -= 1
                        if children[p] == 0 and p not in mine:
                            enqueue(p, deadlines[p])
                    break
                else:
                    break
            if len(depth) >= capacity:
                break
            b = ids[k]
            depth[b], parent[b], children[b] = k, ids[k - 1] if k else -1, 0
            deadlines[b] = rank(i, k, b)
            if k:
                children[ids[k - 1]] += 1
        for entry in held:
            heapq.heappush(heap, entry)
        for b in ids:  # re-rank this request's leaves with their new deadlines
            if b in depth and children[b] == 0:
                enqueue(b, deadlines[b])
    return hits


def deadline(trace: Trace, protect: Callable[[int, int], bool], probation: int) -> Rank:
    """``last use + LONG`` for protected uses, ``last use + probation`` for the rest."""
    return lambda i, k, b: i + (LONG if protect(i, k) else probation)


def ladder(trace: Trace) -> List[Tuple[str, str, Sequence[Tuple[str, Rank]]]]:
    """(rung, knowledge, candidate ranks) in order of growing knowledge."""
    uses, nxt, out = trace.uses, trace.next_use, trace.outputs
    size = [len(ids) for ids in trace.ids]
    t1s = (0, 100, 300)
    rungs = [("lru", "recency", [("", lambda i, k, b: i)])]
    rungs.append(("uses", "use count (perfect history of evicted pages)", [
        (f"probation {t}", deadline(trace, lambda i, k: uses[i][k] > 1, t)) for t in t1s]))
    request = []
    for o, x, t in itertools.product((0, 8, 32), (48, NEVER), t1s):  # (0, NEVER): rung 1
        request.append((f"output < {o} or size >= {x} blocks, probation {t}", deadline(
            trace, lambda i, k, o=o, x=x: uses[i][k] > 1 or out[i] < o or size[i] >= x, t)))
    rungs.append(("uses + request", "also the request's output length and size", request))
    rungs.append(("+ first-use oracle", "also whether a first use will be used again (future)", [
        (f"probation {t}", deadline(trace, lambda i, k: uses[i][k] > 1 or nxt[i][k] < NEVER, t)) for t in t1s]))
    rungs.append(("+ session-end oracle", "whether any use will be used again (future)", [
        ("", deadline(trace, lambda i, k: nxt[i][k] < NEVER, 0))]))
    return rungs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conversation,synthetic")
    ap.add_argument("--num-tokens", type=int, default=3_000_000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results", "policy_headroom"))
    args = ap.parse_args(argv)
    capacity = args.num_tokens // BLOCK
    rows = []
    for name in args.traces.split(","):
        path = os.path.join(TRACES, f"mooncake_{name}.jsonl")
        trace, requests = Trace(path), list(TraceReader(path))
        total = sum(trace.lengths)
        lru = replay(requests, PrefixCache(capacity, BLOCK, policy="lru"), miss_reasons=False)
        belady = replay(requests, PrefixCache(capacity, BLOCK, policy="belady"), miss_reasons=False)
        for rung, knowledge, candidates in ladder(trace):
            scored = [(simulate(trace, capacity, rank), label) for label, rank in candidates]
            best, label = max(scored, key=lambda s: s[0])
            if rung == "lru" and best != lru.hit_tokens:
                sys.exit(f"{name}: block simulation {best} != radixkv replay {lru.hit_tokens} hit tokens")
            rows.append({"trace": name, "num_tokens": args.num_tokens, "rung": rung, "knowledge": knowledge,
                         "best": label, "token_hit_rate": best / total})
            print(f"{name} {rung}: {100 * best / total:.2f}% ({label})", flush=True)
        rows.append({"trace": name, "num_tokens": args.num_tokens, "rung": "belady", "knowledge": "the future",
                     "best": "", "token_hit_rate": belady.token_hit_rate})
    write(rows, args)


def write(rows: List[dict], args: argparse.Namespace) -> None:
    with open(args.out + ".jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    names = list(dict.fromkeys(r["trace"] for r in rows))
    md = [f"# Policy headroom at {args.num_tokens / 1e6:g}M tokens (512-token blocks)", "",
          "Best deadline policy per rung of knowledge; in parentheses the share of the LRU-to-Belady gap "
          "closed (the target is 25%). Windows tuned on the scored trace. Generated by "
          "`python bench/studies/policy_headroom.py`.", "",
          "| knowledge | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    by = {(r["trace"], r["rung"]): r["token_hit_rate"] for r in rows}
    for rung in dict.fromkeys(r["rung"] for r in rows):
        cells = []
        for name in names:
            rate, lo, hi = by[name, rung], by[name, "lru"], by[name, "belady"]
            cells.append(f"{100 * rate:.2f}% ({100 * (rate - lo) / (hi - lo):+.0f}%)")
        knowledge = next(r["knowledge"] for r in rows if r["rung"] == rung)
        md.append(f"| {rung}: {knowledge} | " + " | ".join(cells) + " |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
