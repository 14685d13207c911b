"""bench/results/page1.md from the JSON lines of bench/perf/page1.py and bench/peers/compare.py.

    .venv/bin/python bench/perf/page1.py --table bench/results/page1.jsonl bench/results/micro_page1.json \
        > bench/results/page1.md

Every figure on the page comes from those files; the prose around them does not
quote any. A ``.json`` file is read as a bench/perf/micro_summary.py summary.
"""

from __future__ import annotations

import json
import statistics
from typing import Dict, List

TARGET_PAGE_RATIO = 1.5  # page-1 replay cost / page-16 replay cost (issue 17)
TARGET_PEER_SPEEDUP = 4.0  # radixkv / SGLang at page 1 (its default cache, issue 17)


def _read(paths: List[str]) -> Dict[str, list]:
    rows: Dict[str, list] = {"cpu": [], "cachegrind": [], "peers": [], "micro": []}
    for path in paths:
        with open(path) as fh:
            if path.endswith(".json"):
                rows["micro"].append(json.load(fh))
                continue
            for line in fh:
                if not line.strip():
                    continue
                row = json.loads(line)
                if row.get("bench") == "page1":
                    rows["cpu"].append(row)
                elif row.get("bench") == "page1-cachegrind":
                    rows["cachegrind"].append(row)
                elif "peers" in row:
                    rows["peers"].append(row)
    return rows


def _m(value: float) -> str:
    return f"{value / 1e6:,.0f}M"


def _cachegrind(rows: list) -> List[str]:
    forms = [r for r in rows if r.get("tokens", "uint32") != "uint32"]
    rows = [r for r in rows if r.get("tokens", "uint32") == "uint32"]
    by = {(r["pool"], r["page_size"]): r for r in rows}
    out = ["## Replay cost, old vs new (valgrind cachegrind, deterministic)", "",
           "Instructions (Ir) and estimated cycles (Ir + 10 x L1 misses + 100 x last-level misses) of the",
           "replay loop alone: the same script with the replay skipped is subtracted.", "",
           "| page | old Ir | new Ir | old est. cycles | new est. cycles | new / old (est. cycles) |",
           "|---:|---:|---:|---:|---:|---:|"]
    for page in sorted({p for _, p in by}):
        old, new = by.get(("old", page)), by.get(("new", page))
        if old and new:
            out.append(f"| {page} | {_m(old['Ir'])} | {_m(new['Ir'])} | {_m(old['est_cycles'])} | "
                       f"{_m(new['est_cycles'])} | {new['est_cycles'] / old['est_cycles']:.2f} |")
    for pool in ("old", "new"):
        one, sixteen = by.get((pool, 1)), by.get((pool, 16))
        if one and sixteen:
            out.append("")
            out.append(f"Page 1 / page 16, {pool}: {one['Ir'] / sixteen['Ir']:.2f}x in instructions, "
                       f"{one['est_cycles'] / sixteen['est_cycles']:.2f}x in estimated cycles "
                       f"(target <= {TARGET_PAGE_RATIO}x).")
    one, sixteen = by.get(("new", 1)), by.get(("new", 16))
    if one and sixteen and abs(one["Ir"] - sixteen["Ir"]) < 0.05 * sixteen["Ir"]:
        out += ["", "Page 1 and page 16 execute the same instructions within 5%: no breakdown of a difference."]
    elif one and sixteen and "functions_Ir" in one and "functions_Ir" in sixteen:
        f1, f16 = one["functions_Ir"], sixteen["functions_Ir"]
        delta = {f: f1.get(f, 0) - f16.get(f, 0) for f in set(f1) | set(f16)}
        extra = one["Ir"] - sixteen["Ir"]
        out += ["", "### Where page 1's extra instructions go (new, page 1 minus page 16, by C function)", "",
                f"Page 1 executes {_m(extra)} more instructions than page 16. Under valgrind a large memcpy",
                "(`rep movsb`) counts about one instruction per byte, so copies weigh more here than in CPU time.",
                "",
                "| C function | page 1 | page 16 | difference | share of the difference |", "|---|---:|---:|---:|---:|"]
        for f, d in sorted(delta.items(), key=lambda kv: -abs(kv[1]))[:14]:
            out.append(f"| `{f}` | {_m(f1.get(f, 0))} | {_m(f16.get(f, 0))} | {_m(d)} | {d / extra:.0%} |")
    if forms:
        out += ["", "The same replay given `array('q')` prompts, as SGLang's `Req` holds them (`--tokens array_q`;",
                "made before the loop, so `admit`'s conversion is counted), against the `uint32` rows above:", "",
                "| tokens | page | version | Ir | est. cycles | / same version with uint32 (est. cycles) |",
                "|---|---:|---|---:|---:|---:|"]
        for r in sorted(forms, key=lambda r: (r["tokens"], r["page_size"], r["pool"] != "old")):
            base = by.get((r["pool"], r["page_size"]))
            ratio = f"{r['est_cycles'] / base['est_cycles']:.2f}" if base else ""
            out.append(f"| {r['tokens']} | {r['page_size']} | {r['pool']} | {_m(r['Ir'])} | {_m(r['est_cycles'])} | {ratio} |")
        out += ["", "The new version narrows the tokens with numpy's checked cast (`casting=\"same_value\"`, numpy 2.4),",
                "a scalar loop: it executes more instructions than a range pass and a strided copy of the tokens'",
                "low halves (an earlier version of this change), yet takes less time per admission measured",
                "alternating per request in one process, which this cycle estimate does not model",
                "(`radixkv.keys.as_tokens`)."]
    return out + [""]


def _cpu(rows: list) -> List[str]:
    out = ["## Replay CPU time, old vs new (process_time of the loop, alternating in one process)", "",
           "| run | tokens | version | page | min (s) | every run (s) | 1-min load |", "|---|---|---|---:|---:|---|---:|"]
    for r in sorted(rows, key=lambda r: (r.get("tag") or "", r.get("tokens", "uint32"), r["page_size"], r["pool"] != "old")):
        out.append(f"| {r.get('tag') or ''} | {r.get('tokens', 'uint32')} | {r['pool']} | {r['page_size']} | {r['cpu_s_min']:.3f} | "
                   f"{', '.join(f'{x:.3f}' for x in r['cpu_s'])} | {r['load_avg_1m']:.1f} |")
    for tag, tokens in sorted({(r.get("tag") or "", r.get("tokens", "uint32")) for r in rows}):
        by = {(r["pool"], r["page_size"]): r["cpu_s_min"] for r in rows
              if (r.get("tag") or "") == tag and r.get("tokens", "uint32") == tokens}
        ratios = [f"page 1 / page 16, {pool}: {by[(pool, 1)] / by[(pool, 16)]:.2f}x"
                  for pool in ("old", "new") if (pool, 1) in by and (pool, 16) in by]
        if ("old", 16) in by and ("new", 16) in by:
            ratios.append(f"page 16, new / old: {by[('new', 16)] / by[('old', 16)]:.2f}x")
        label = ", ".join(x for x in (tag, tokens) if x)
        ratios.append(f"page 1, new / old: {by[('new', 1)] / by[('old', 1)]:.2f}x" if ("old", 1) in by and ("new", 1) in by else "")
        out += ["", f"Min CPU time ({label}): " + "; ".join(x for x in ratios if x) + "."]
    hits = sorted({(r["page_size"], r["hit_tokens"], r["evicted_blocks"]) for r in rows})
    out += ["", "Hit tokens and evicted blocks, equal for both versions: "
            + "; ".join(f"page {p}: {h:,} hit tokens, {e:,} evicted blocks" for p, h, e in hits) + "."]
    return out + [""]


def _peers(rows: list) -> List[str]:
    names = {"sglang": "SGLang `RadixCache` (Python)", "sglang-unified": "SGLang `UnifiedRadixCache` (Rust core, its default)"}
    ours = {"radixkv": "uint32", "radixkv-q": "array('q')"}
    out = ["## Side by side with SGLang's caches (bench/peers/compare.py)", "",
           "Each row is one compare.py run (its repetitions alternate the peers in one process); radixkv's",
           "ratio divides its best rate by the peer's best, and its median rate by the peer's median.",
           "SGLang is given `array('q')` (what its `Req` holds); radixkv `uint32` arrays (`radixkv`) or the",
           "same `array('q')` (`radixkv-q`: its conversion is inside the timed `admit`).", "",
           "| run | page | blocks | radixkv given | peer | radixkv req/s | peer req/s | radixkv / peer, best | same, medians |"
           " radixkv p50 us | peer p50 us | hit tokens radixkv / peer | 1-min load |",
           "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["page_size"], r.get("tag") or "")):
        pairs = [(us, form, peer, name) for us, form in ours.items() for peer, name in names.items()
                 if us in r["peers"] and peer in r["peers"]]
        for us, form, peer, name in pairs:
            rk, sg = r["peers"][us], r["peers"][peer]
            out.append(f"| {r.get('tag') or ''} | {r['page_size']} | {r['num_blocks']:,} | {form} | {name} | "
                       f"{rk['requests_per_second']:,.0f} | {sg['requests_per_second']:,.0f} | "
                       f"{rk['requests_per_second'] / sg['requests_per_second']:.2f} | "
                       f"{statistics.median(rk['all_rates']) / statistics.median(sg['all_rates']):.2f} | "
                       f"{rk['per_request_us']['p50']:.0f} | {sg['per_request_us']['p50']:.0f} | "
                       f"{rk['hit_tokens']:,} / {sg['hit_tokens']:,} | {r['load_avg_1m']:.1f} |")
    for us, form in ours.items():
        for peer, name in names.items():
            page1 = [r for r in rows if r["page_size"] == 1 and peer in r["peers"] and us in r["peers"]]
            if page1:
                best = [r["peers"][us]["requests_per_second"] / r["peers"][peer]["requests_per_second"] for r in page1]
                med = [statistics.median(r["peers"][us]["all_rates"]) / statistics.median(r["peers"][peer]["all_rates"])
                       for r in page1]
                out += ["", f"Page 1, radixkv given {form} / {name}: {min(best):.2f}-{max(best):.2f}x (best), "
                            f"{min(med):.2f}-{max(med):.2f}x (medians) over {len(page1)} runs; target >= {TARGET_PEER_SPEEDUP}x."]
    return out + [""]


def _micro(summaries: list) -> List[str]:
    out = ["## Micro-benchmarks at page 1 (bench/perf/test_micro.py, new, microseconds)", "",
           "Prompts are at most 128 pages (128 tokens at page 1) and evict moves 32 blocks: these measure the",
           "per-call overhead at each cache size, not the 10^4-id moves of the trace.", "",
           "| operation | cached blocks | min | median | rounds |", "|---|---:|---:|---:|---:|"]
    for summary in summaries:
        for b in sorted((b for b in summary["benchmarks"] if b["group"] != "test_replay_throughput"),
                        key=lambda b: (b["group"], b.get("cached_blocks", 0))):
            out.append(f"| {b['group'][5:]} | {b.get('cached_blocks', b['param'])} | {b['min'] * 1e6:.1f} | "
                       f"{b['median'] * 1e6:.1f} | {b['rounds']} |")
        m = summary["machine"]
        out += ["", f"Summarized {summary.get('datetime')}, 1-minute load {m.get('load_average_1m')}."]
    return out + [""]


def render(paths: List[str]) -> str:
    """The markdown page for the rows in ``paths``."""
    rows = _read(paths)
    revs = sorted({r["pool_rev"] for kind in ("cpu", "cachegrind") for r in rows[kind] if r["pool"] == "old"})
    machine = next((r["machine"] for kind in ("cpu", "cachegrind", "peers") for r in rows[kind]), {})
    lines = ["# Page size 1: block ids as extents in the tree, on a run-based, lazily grown pool (issue 17)", "",
             "Mooncake conversation trace, first 2000 requests, 3M tokens of HBM (2,999,808 blocks at page 1,",
             "187,488 at page 16), LRU, one admit + release per request. \"old\" is radixkv at the revision in",
             f"each row's `pool_rev` ({', '.join(revs) or '?'}), \"new\" this revision; bench/perf/page1.py",
             "imports the old package under another name, so both run in one process. Earlier versions of this",
             "page (old = the pool before runs, 9ff1979; nodes holding one id array each, 4f3b99b) are in git history.",
             f"Machine: {machine.get('cpu', '?')}, {machine.get('nproc', '?')} CPUs shared with other jobs, "
             f"Python {machine.get('python', '?')}, numpy {machine.get('numpy', '?')}.", "",
             "Regenerate:", "",
             f"    .venv/bin/python bench/perf/page1.py --old-rev {'/'.join(revs) or 'REV'} --cachegrind --out bench/results/page1.jsonl",
             f"    .venv/bin/python bench/perf/page1.py --old-rev {'/'.join(revs) or 'REV'} --cachegrind --pages 1 --tokens array_q \\",
             "        --out bench/results/page1.jsonl",
             f"    .venv/bin/python bench/perf/page1.py --old-rev {'/'.join(revs) or 'REV'} --repeat 5 --out bench/results/page1.jsonl",
             f"    .venv/bin/python bench/perf/page1.py --old-rev {'/'.join(revs) or 'REV'} --repeat 5 --pages 1 --tokens array_q \\",
             "        --out bench/results/page1.jsonl",
             "    for run in 1 2 3; do for page in 1 16; do   # from the checkout's root, with the peers' venv",
             "      bench/peers/.venv/bin/python bench/peers/here.py bench/peers/compare.py --traces mooncake_conversation \\",
             "        --limit 2000 --capacities $((2999808 / page)) --page-size $page --repeat 5 \\",
             "        --peers radixkv radixkv-q sglang sglang-unified --tag run$run --out bench/results/page1_unified.jsonl",
             "    done; done",
             "    RADIXKV_BENCH_PAGE=1 .venv/bin/python -m pytest bench/perf/test_micro.py --benchmark-only \\",
             "        --benchmark-disable-gc -k 'not replay' --benchmark-json /tmp/micro1.json",
             "    .venv/bin/python bench/perf/micro_summary.py /tmp/micro1.json bench/results/micro_page1",
             "    .venv/bin/python bench/perf/page1.py --table bench/results/page1.jsonl bench/results/page1_unified.jsonl \\",
             "        bench/results/micro_page1.json \\",
             "        > bench/results/page1.md",
             "    .venv/bin/python bench/perf/page1.py --pools new --repeat 1 --no-check --profile 25   # cProfile", ""]
    if rows["cachegrind"]:
        lines += _cachegrind(rows["cachegrind"])
    if rows["cpu"]:
        lines += _cpu(rows["cpu"])
    if rows["peers"]:
        lines += _peers(rows["peers"])
    if rows["micro"]:
        lines += _micro(rows["micro"])
    return "\n".join(lines).rstrip("\n") + "\n"
