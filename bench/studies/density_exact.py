"""Exact predicted-hit-density eviction on the Mooncake traces: the victim is the argmin over all evictable blocks.

    python bench/studies/density_exact.py [--traces conversation,synthetic] [--num-tokens 3000000]
                                          [--variants "issue;horizon=0,..."] [--out bench/results/density_exact]
                                          [--append] [--md-only]

The rule (issue 15's study, as written): every block gets a class at each
use (uses so far, capped at 4, counting the uses a bounded ghost of evicted
block hashes remembers, x quarter of its request x request-length bucket,
optionally x output-length bucket); every ``refit`` requests, per class,
a Kaplan-Meier fit of the time between successive uses of a block over
log-spaced bins (a block not used again yet, in the cache or the ghost, is
censored at its age; one the ghost forgets, at its age then); a block of
class ``c`` and age ``a`` has the hit density

    (S(a) - S(a + H)) / integral of S over [a, a + H]

with ``H`` the cache's eviction age (a moving average of the victims' ages),
and the victim is the evictable block (a leaf of the tree, not the current
request's) of lowest density, over *all* of them: used-again blocks included,
no window, no lanes. Ties: the older last use, then the deeper block. LRU
until the first fit with history. A class with fewer than ``min_obs``
observations borrows the pooled fit of its use level (then of all classes).

Replay semantics are radixkv's at page 512 (one page = one 512-token block,
the longest cached prefix hits, the request's new full blocks are cached, its
own blocks are protected, the partial last block is never cached); the
``lru`` variant is checked against radixkv's replay (exit 1 if the hit tokens
differ). Densities are piecewise constant per (class, age bin): a block's
age is looked up on a grid of ``sub`` points per KM bin (``sub=1``: the
bin's lower edge, as ``density``'s tables). O(cached blocks) per request
that evicts (numpy), so a study, not a policy.

Variants (:class:`Variant`, written ``issue;field=value;...``): ``horizon``
(a multiple of the eviction age; ``0``: the whole fitted range), ``clock``
(requests or the trace's milliseconds), ``per_octave`` / ``sub`` (bins),
``ghost`` (its size x capacity; ``0``: never forgets), the class set
(``quarters``, ``length_edges``, ``output_edges``, ``use_levels``),
``refit``, ``min_obs``, ``decay``, ``boost`` (blocks used again: density
x boost; ``inf``: always kept above first uses, LRU among them) and
``heads`` (only the oldest evictable block of each class is a candidate: the
lane heads radixkv's ``density`` compares, instead of every block).

Reported: token hit rate over the whole trace, its first and second half
(the halves of one replay), and the share of the LRU-to-Belady gap each
closes (LRU and Belady from radixkv's replay of the same halves; their
per-request hits are kept in ``/tmp/density_exact_ref_<trace>_<blocks>.json``
between runs).

Findings at 3M tokens (``bench/results/density_exact.md``): on the
conversation trace the rule as written (``H`` = the eviction age) closes
15.6% of the gap; the horizon decides it: the whole fitted range 22.9%
(24.2% with output-length buckets), 2x-4x the eviction age 21.2-22.3%,
0.5x 6.3%. The exact argmin and the lane heads agree to 0.2 points of the
gap (22.9% / 22.9%; synthetic 3.6% / 3.4%), so the exact argmin is not what
the deadline rule of ``density`` misses: it is ranking the pages used again
by their classes' densities too (kept above first uses instead, ``boost=inf``,
20.8%: the default ``density``'s 20.9%). On the synthetic trace the same
variants close 3.6-5.5% (second half below LRU); only 2x-3x the eviction
age with output buckets reaches 11.6-12.1% (the output-length classes alone
14.0%, but 19.0% on the conversation trace). 3x with output buckets meets both figures here (22.6% / 12.1%), but
the first halves do not choose it (summed over both traces' first halves
the whole range with output buckets wins, 43.6 points against 42.4), and
radixkv's ``density`` with ``rank="density", horizon_factor=3`` gets
23.1% / 8.8% (its ghost keeps runs, not blocks, and its open observations
by refit period). No choice made on first halves meets both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "..", "..", "shared", "traces")
BLOCK = 512
QUARTERS = 4


@dataclass(frozen=True)
class Variant:
    """One rule: the clock, the classes, the bins, the horizon, the ghost."""

    clock: str = "requests"  # or "ms": the trace's timestamps
    length_edges: Tuple[int, ...] = (2048, 8192, 32768)
    output_edges: Tuple[int, ...] = ()
    quarters: bool = True
    per_octave: int = 2  # KM bins per doubling of the age
    sub: int = 1  # density grid points per KM bin
    horizon: float = 1.0  # H = horizon x the eviction age (0: to the end of the fit)
    ghost: float = 4.0  # ghost size in blocks, x capacity (0: perfect memory, never forgets)
    refit: int = 200  # requests between refits
    min_obs: int = 200
    lru: bool = False  # rank by last use only (the semantics check)
    use_levels: Tuple[int, ...] = (1, 2, 3, 4)  # lower edges of the use-count levels (uses 1..: the last one open)
    decay: float = 1.0  # the closed observations are multiplied by this at every refit (1: no forgetting)
    boost: float = 1.0  # the densities of blocks used twice or more are multiplied by this (inf: kept above first uses, LRU)
    heads: bool = False  # candidates: only the oldest evictable block of each class (lane heads), not all


class Trace:
    """Block lists of a Mooncake trace (cacheable full blocks only) and the request fields."""

    def __init__(self, path: str) -> None:
        rows = [json.loads(line) for line in open(path)]
        self.ids = [np.array(r["hash_ids"][: r["input_length"] // BLOCK], dtype=np.int64) for r in rows]
        self.lengths = np.array([r["input_length"] for r in rows], dtype=np.int64)
        self.outputs = np.array([r["output_length"] for r in rows], dtype=np.int64)
        self.stamps = np.array([r["timestamp"] for r in rows], dtype=np.int64)
        self.num_ids = 1 + max(int(ids.max()) for ids in self.ids if len(ids))


def bucket(value: int, edges: Tuple[int, ...]) -> int:
    return int(np.searchsorted(np.asarray(edges), value, side="right")) if edges else 0


class Fit:
    """Kaplan-Meier survival per class over log-spaced age bins, and the density table."""

    def __init__(self, classes: int, levels: int, v: Variant, max_age: float) -> None:
        self.levels = levels
        top = int(np.ceil(np.log2(max(2.0, max_age)) * v.per_octave)) + 2
        self.edges = np.concatenate([[0.0], 2.0 ** (np.arange(top) / v.per_octave)])  # bin j: [edges[j], edges[j+1])
        self.bins = len(self.edges) - 1
        fine = [self.edges[0]]
        for j in range(self.bins):
            fine += list(np.linspace(self.edges[j], self.edges[j + 1], v.sub + 1)[1:] if j == 0 else
                         np.geomspace(self.edges[j], self.edges[j + 1], v.sub + 1)[1:])
        self.grid = np.array(fine[:-1])  # density evaluated at these ages; a block uses the last one <= its age
        self.v = v
        self.classes = classes
        self.events = np.zeros((classes, self.bins))
        self.censored = np.zeros((classes, self.bins))
        self.table = np.zeros((classes, len(self.grid)))

    def bin_of(self, ages: np.ndarray) -> np.ndarray:
        return np.minimum(np.searchsorted(self.edges, ages, side="right") - 1, self.bins - 1)

    def grid_of(self, ages: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.grid, ages, side="right") - 1

    def refit(self, open_cls: np.ndarray, open_ages: np.ndarray, horizon: float, uses_of_class: np.ndarray) -> bool:
        """Refit from the closed observations and the open ones (censored at their age). False: too little history."""
        ended = self.events + self.censored
        opened = np.zeros_like(ended)
        np.add.at(opened, (open_cls, self.bin_of(open_ages)), 1.0)
        total = ended + opened
        risk = np.cumsum(total[:, ::-1], axis=1)[:, ::-1]
        events = self.events
        if risk[:, 0].sum() < self.v.min_obs or events.sum() <= 0:
            return False
        levels = uses_of_class
        lvl_risk = np.zeros((self.levels, self.bins))
        lvl_events = np.zeros((self.levels, self.bins))
        np.add.at(lvl_risk, levels, risk)
        np.add.at(lvl_events, levels, events)
        own = risk[:, 0] >= self.v.min_obs
        pooled = lvl_risk[levels, 0] >= self.v.min_obs
        r = np.where(own[:, None], risk, np.where(pooled[:, None], lvl_risk[levels], risk.sum(0)))
        e = np.where(own[:, None], events, np.where(pooled[:, None], lvl_events[levels], events.sum(0)))
        hazard = np.divide(e, r, out=np.zeros_like(e), where=r > 0)
        surv = np.concatenate([np.ones((self.classes, 1)), np.cumprod(1 - np.clip(hazard, 0, 1), axis=1)], axis=1)
        area = np.concatenate([np.zeros((self.classes, 1)),
                               np.cumsum((surv[:, 1:] + surv[:, :-1]) / 2 * np.diff(self.edges), axis=1)], axis=1)
        h = horizon if horizon > 0 else self.edges[-1]
        for c in range(self.classes):
            s_a = np.interp(self.grid, self.edges, surv[c])
            s_h = np.interp(self.grid + h, self.edges, surv[c])
            cost = np.interp(self.grid + h, self.edges, area[c]) - np.interp(self.grid, self.edges, area[c])
            self.table[c] = np.divide(s_a - s_h, cost, out=np.zeros(len(self.grid)), where=cost > 1e-12)
        return True


def simulate(trace: Trace, capacity: int, v: Variant) -> np.ndarray:
    """Hit tokens per request of a replay through ``capacity`` blocks under ``v``."""
    n_ids = trace.num_ids
    cats = (len(v.length_edges) + 1) * (len(v.output_edges) + 1)
    quarters = QUARTERS if v.quarters else 1
    levels = len(v.use_levels)
    level_of = np.zeros(1 << 16, dtype=np.int64)
    for j, lo in enumerate(v.use_levels):
        level_of[lo:] = j
    classes = levels * quarters * cats
    clock = trace.stamps if v.clock == "ms" else np.arange(len(trace.ids))
    fit = Fit(classes, levels, v, float(clock[-1] - clock[0]) + 1)
    uses_of_class = np.arange(classes) // (quarters * cats)
    cached = np.zeros(n_ids, dtype=bool)
    children = np.zeros(n_ids, dtype=np.int64)
    parent = np.full(n_ids, -1, dtype=np.int64)
    depth = np.zeros(n_ids, dtype=np.int64)
    last = np.zeros(n_ids, dtype=np.int64)
    cls = np.zeros(n_ids, dtype=np.int64)
    uses = np.zeros(n_ids, dtype=np.int64)  # uses so far of a cached or remembered block
    in_ghost = np.zeros(n_ids, dtype=bool)
    ghost_stamp = np.zeros(n_ids, dtype=np.int64)
    ghost: deque = deque()
    ghost_live = 0
    ghost_cap = int(v.ghost * capacity) if v.ghost > 0 else 1 << 62
    n_cached = 0
    evictions = 0
    horizon_age = float(np.median(np.diff(clock[:: max(1, len(clock) // 100)])) * 50 + 1)
    fitted = False
    hits = np.zeros(len(trace.ids), dtype=np.int64)
    rank = np.zeros(n_ids, dtype=np.int64)
    events, censored = fit.events, fit.censored

    for i, ids in enumerate(trace.ids):
        now = int(clock[i])
        if i and i % v.refit == 0 and not v.lru:
            tracked = np.flatnonzero(cached | in_ghost)
            events *= v.decay
            censored *= v.decay
            fitted = fit.refit(cls[tracked], now - last[tracked], v.horizon * horizon_age, uses_of_class) or fitted
        n = len(ids)
        if n == 0:
            continue
        h = 0
        while h < n and cached[ids[h]]:
            h += 1
        hits[i] = h * BLOCK
        cat = bucket(int(trace.lengths[i]), v.length_edges) * (len(v.output_edges) + 1) + bucket(
            int(trace.outputs[i]), v.output_edges)
        q = np.minimum(quarters - 1, quarters * np.arange(n) // n) if v.quarters else np.zeros(n, dtype=np.int64)
        # the hit prefix is used now: close its observations
        hit_ids = ids[:h]
        if h:
            np.add.at(events, (cls[hit_ids], fit.bin_of(now - last[hit_ids])), 1.0)
            uses[hit_ids] += 1
        ranked = False
        inserted = h
        for k in range(h, n):
            if n_cached >= capacity:
                if not ranked:  # rank every cached block once per request: ages are fixed within it
                    snap = np.flatnonzero(cached)
                    if v.lru or not fitted:
                        dens = np.zeros(len(snap))
                    else:
                        dens = fit.table[cls[snap], fit.grid_of(now - last[snap])]
                        if v.boost != 1.0:
                            again = uses_of_class[cls[snap]] > 0
                            dens = np.where(again, np.inf if np.isinf(v.boost) else dens * v.boost, dens)
                    order = np.lexsort((-depth[snap], last[snap], dens))
                    rank[snap[order]] = np.arange(len(snap))
                    mine = set(ids.tolist())
                    ok = (children[snap] == 0) & ~np.isin(snap, ids)
                    key = np.where(ok, rank[snap], np.iinfo(np.int64).max)
                    key_all = rank[snap]
                    pos = {int(b): j for j, b in enumerate(snap)}
                    ranked = True
                    if v.heads:

                        def head_of(c: int) -> int:
                            """Snapshot index of class ``c``'s oldest evictable block, -1 if none."""
                            part = lane_order[starts[c]:starts[c + 1]]
                            ev = key[part] != np.iinfo(np.int64).max
                            return int(part[ev.argmax()]) if ev.any() else -1

                        lane_order = np.lexsort((-depth[snap], last[snap], cls[snap]))  # per class, oldest first
                        lane_cls = cls[snap[lane_order]]
                        starts = np.searchsorted(lane_cls, np.arange(classes + 1))
                        heads = {}
                        for c in np.unique(lane_cls):
                            heads[int(c)] = head_of(int(c))
                if v.heads:  # the lane heads' lowest rank (density, then older, then deeper)
                    live = [j for j in heads.values() if j >= 0]
                    if not live:
                        break
                    s = min(live, key=lambda j: key_all[j])
                else:
                    s = int(np.argmin(key))
                if key[s] == np.iinfo(np.int64).max:
                    break
                b = int(snap[s])
                key[s] = np.iinfo(np.int64).max
                cached[b] = False
                n_cached -= 1
                evictions += 1
                horizon_age += 0.01 * (max(1, now - last[b]) - horizon_age)
                p = int(parent[b])
                if p >= 0:
                    children[p] -= 1
                    if children[p] == 0 and p not in mine:
                        key[pos[p]] = rank[p]
                        if v.heads:
                            heads[int(cls[p])] = head_of(int(cls[p]))
                if v.heads:
                    heads[int(cls[b])] = head_of(int(cls[b]))
                # remember it
                in_ghost[b] = True
                ghost_stamp[b] = evictions
                ghost.append((b, evictions))
                ghost_live += 1
                while ghost_live > ghost_cap:
                    g, stamp = ghost.popleft()
                    if in_ghost[g] and ghost_stamp[g] == stamp:
                        in_ghost[g] = False
                        censored[cls[g], fit.bin_of(np.array([now - last[g]]))[0]] += 1
                        uses[g] = 0
                        ghost_live -= 1
            b = int(ids[k])
            if in_ghost[b]:  # remembered: its previous use's observation closes as a reuse
                in_ghost[b] = False
                ghost_live -= 1
                events[cls[b], fit.bin_of(np.array([now - last[b]]))[0]] += 1
                uses[b] += 1
            else:
                uses[b] = 1
            cached[b] = True
            n_cached += 1
            depth[b] = k
            parent[b] = ids[k - 1] if k else -1
            children[b] = 0
            if k:
                children[ids[k - 1]] += 1
            inserted = k + 1
        used = ids[:inserted]
        last[used] = now
        cls[used] = (level_of[np.minimum(uses[used], len(level_of) - 1)] * quarters + q[:inserted]) * cats + cat
    return hits


def reference(trace_name: str, requests_path: str, capacity: int, cache_file: str) -> Dict[str, List[int]]:
    """Per-request hit tokens of radixkv's lru and belady at page 512 (cached in ``cache_file``)."""
    if os.path.exists(cache_file):
        with open(cache_file) as f:
            got = json.load(f)
        if got.get("key") == [trace_name, capacity]:
            return got
    from radixkv import PrefixCache
    from radixkv.analysis.replay import replay
    from radixkv.workload.traces import TraceReader
    requests = list(TraceReader(requests_path))
    out: Dict = {"key": [trace_name, capacity]}
    for policy in ("lru", "belady"):
        per = []
        replay(requests, PrefixCache(capacity, BLOCK, policy=policy), on_request=lambda r, hit: per.append(hit),
               miss_reasons=False)
        out[policy] = per
    with open(cache_file, "w") as f:
        json.dump(out, f)
    return out


def shares(hits: np.ndarray, ref: Dict[str, List[int]], lengths: np.ndarray) -> Dict[str, float]:
    half = len(lengths) // 2
    parts = {"whole": slice(0, None), "first": slice(0, half), "second": slice(half, None)}
    out = {}
    lru, opt = np.array(ref["lru"]), np.array(ref["belady"])
    for name, sl in parts.items():
        total = lengths[sl].sum()
        rate, lo, hi = hits[sl].sum() / total, lru[sl].sum() / total, opt[sl].sum() / total
        out[name] = float(rate)
        out[name + "_gap"] = float((rate - lo) / (hi - lo))
    return out


VARIANTS: Dict[str, Variant] = {
    "lru": Variant(lru=True),
    "issue": Variant(),
}

DEFAULT_SPECS = [
    "lru", "issue", "issue;horizon=0.5", "issue;horizon=2", "issue;horizon=3", "issue;horizon=4", "issue;horizon=0",
    "issue;horizon=0;heads=1", "issue;horizon=0;ghost=0", "issue;horizon=0;clock=ms", "issue;horizon=0;per_octave=4",
    "issue;horizon=0;output_edges=32/128", "issue;horizon=2;output_edges=32/128", "issue;horizon=3;output_edges=32/128",
    "issue;horizon=0;output_edges=32/128;boost=inf", "issue;quarters=0;length_edges=-;output_edges=32/128",
    "issue;horizon=3;quarters=0;length_edges=-;output_edges=32/128",
    "issue;horizon=0;quarters=0;length_edges=-;output_edges=32/128",
]
"""The variants of ``bench/results/density_exact.md``: ``horizon=0`` is H = the whole fitted range."""


def variant_from(spec: str) -> Variant:
    """``name`` of :data:`VARIANTS`, then ``;field=value`` overrides (tuples as ``a/b/c``, empty ``-``)."""
    base, *fields = spec.split(";")
    v = VARIANTS[base]
    for f in fields:
        k, val = f.split("=")
        cur = getattr(v, k)
        if isinstance(cur, tuple):
            new = tuple(int(x) for x in val.split("/")) if val != "-" else ()
        elif isinstance(cur, bool):
            new = val in ("1", "true", "True")
        else:
            new = type(cur)(val)
        v = replace(v, **{k: new})
    return v


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conversation,synthetic")
    ap.add_argument("--num-tokens", type=int, default=3_000_000)
    ap.add_argument("--variants", default=",".join(DEFAULT_SPECS), help="specs separated by ',' (see variant_from)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results", "density_exact"))
    ap.add_argument("--append", action="store_true", help="add to <out>.jsonl instead of replacing it")
    ap.add_argument("--md-only", action="store_true", help="rewrite <out>.md from <out>.jsonl")
    args = ap.parse_args(argv)
    if not args.md_only:
        run(args)
    write_md(args.out)


def run(args: argparse.Namespace) -> None:
    capacity = args.num_tokens // BLOCK
    with open(args.out + ".jsonl", "a" if args.append else "w") as out:
        for name in args.traces.split(","):
            path = os.path.join(TRACES, f"mooncake_{name}.jsonl")
            trace = Trace(path)
            ref = reference(name, path, capacity, f"/tmp/density_exact_ref_{name}_{capacity}.json")
            lengths = trace.lengths
            for policy in ("lru", "belady"):
                s = shares(np.array(ref[policy]), ref, lengths)
                out.write(json.dumps({"trace": name, "capacity": capacity, "spec": f"radixkv {policy}", **s}) + "\n")
            for spec in args.variants.split(","):
                v = variant_from(spec)
                t = time.perf_counter()
                hits = simulate(trace, capacity, v)
                s = shares(hits, ref, lengths)
                if v.lru and int(hits.sum()) != int(sum(ref["lru"])):
                    sys.exit(f"{name}: lru simulation {hits.sum()} != radixkv replay {sum(ref['lru'])} hit tokens")
                row = {"trace": name, "capacity": capacity, "spec": spec, **s, "seconds": round(time.perf_counter() - t, 1)}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{name} {spec}: whole {100 * s['whole']:.2f}% ({100 * s['whole_gap']:+.1f}%) first "
                      f"{100 * s['first_gap']:+.1f}% second {100 * s['second_gap']:+.1f}% [{row['seconds']}s]", flush=True)


def write_md(out: str) -> None:
    """The table of ``<out>.jsonl``: per variant and trace, whole / first half / second half and their gap shares."""
    with open(out + ".jsonl") as f:
        rows = [json.loads(line) for line in f]
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    by = {(r["trace"], r["spec"]): r for r in rows}
    md = ["# Exact predicted hit density (argmin over all evictable blocks), 3M tokens, block level", "",
          "Token hit rate whole trace, and the share of the LRU-to-Belady gap closed over the whole trace / its first half / "
          "its second half (halves of one replay). Generated by `python bench/studies/density_exact.py` (rule and "
          "variant fields in its docstring and `Variant`); LRU and Belady are radixkv's replays; the `lru` row is "
          "the study's own replay (checked equal to radixkv's).", "",
          "| variant | " + " | ".join(traces) + " |", "|---|" + "---|" * len(traces)]
    for spec in specs:
        cells = []
        for t in traces:
            r = by.get((t, spec))
            if r is None:
                cells.append("")
            elif spec.startswith("radixkv"):
                cells.append(f"{100 * r['whole']:.2f}% (first {100 * r['first']:.2f}%, second {100 * r['second']:.2f}%)")
            else:
                cells.append(f"{100 * r['whole']:.2f}%: {100 * r['whole_gap']:+.1f}% / {100 * r['first_gap']:+.1f}% / "
                             f"{100 * r['second_gap']:+.1f}%")
        md.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
