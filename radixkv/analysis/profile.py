"""What a trace holds before any cache sees it: ``radixkv analyze``.

One pass over the requests gives prompt and output length distributions, the
reuse distance of every page reference (the LRU stack distance under the radix
replay rule, from :class:`~radixkv.analysis.curve.LruStackDistances`: a re-used
page at distance ``d`` hits in an LRU cache of more than ``d`` pages), page
popularity with a Zipf fit of its rank-frequency curve, how deep each request's
prefix was seen before (what a cache that never evicts would serve), and the
request rate. Pages are identified as the one-pass curve identifies them
(Mooncake block ids when the page size divides 512, else interned prefixes), so
the numbers agree with ``radixkv curve``.

Cost: the curve's pass (O(R log R) numpy work for R page references) plus
O(distinct pages) memory for the popularity counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional

import numpy as np

from ..errors import ArgumentValueError
from ..workload.traces import Request
from .curve import LruStackDistances
from .plot import compact
from .sweep import _page_ids

RATE_WINDOW_SECONDS = 60.0
"""The window of the peak request rate: the busiest minute."""


def distribution(values: np.ndarray) -> Dict[str, float]:
    """``{"mean", "p50", "p90", "p99", "max"}`` of ``values`` (zeros for none). O(n log n)."""
    if not len(values):
        return dict.fromkeys(("mean", "p50", "p90", "p99", "max"), 0.0)
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(values.max())}


def zipf_fit(counts: np.ndarray, points: int = 50) -> Dict[str, float]:
    """Least-squares fit of ``log(frequency) = c - alpha * log(rank)`` over ``points`` log-spaced
    ranks of ``counts`` sorted in decreasing order (so the long tail does not outweigh the head);
    ``{"alpha", "c", "r2"}``, zeros with fewer than 3 distinct ranks. O(n log n)."""
    freq = np.sort(counts[counts > 0])[::-1]
    ranks = popularity_ranks(len(freq), points)
    if len(ranks) < 3:
        return {"alpha": 0.0, "c": 0.0, "r2": 0.0}
    x, y = np.log(ranks), np.log(freq[ranks - 1])
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    total = ((y - y.mean()) ** 2).sum()
    return {"alpha": float(-slope), "c": float(intercept),
            "r2": float(1 - (residual ** 2).sum() / total) if total else 1.0}


def popularity_ranks(pages: int, points: int = 50) -> np.ndarray:
    """About ``points`` log-spaced ranks from 1 to ``pages`` (distinct, increasing). O(points)."""
    return np.unique(np.geomspace(1, pages, min(points, pages)).astype(np.int64)) if pages else np.empty(0, np.int64)


@dataclass(frozen=True)
class TraceProfile:
    """What :func:`profile` measured.

    Attributes:
        requests, prompt_tokens, page_size: the trace's size, and the page the pages are cut at.
        prompt_length, output_length: :func:`distribution` of tokens per request (output
            all zeros when the trace does not say).
        distinct_pages, page_references: full pages ever seen, and their references.
        reuse_distance: ``[[low, high, references], ...]``: references of re-used pages by LRU
            stack distance in pages, ``low <= d < high``, power-of-two buckets.
        first_references: references of pages never seen before (infinite distance).
        popularity: ``[[rank, references], ...]`` of the pages by references, at log-spaced ranks.
        zipf_alpha, zipf_c, zipf_r2: :func:`zipf_fit` of the references per page.
        top_1pct_share: share of references that go to the most referenced 1% of pages.
        shared_prefix: :func:`distribution` of the tokens of each request's prefix seen before.
        requests_sharing: share of requests whose first page was seen before.
        duration_seconds, request_rate, peak_request_rate: from the timestamps (requests per
            second over the trace, and in its busiest :data:`RATE_WINDOW_SECONDS`); 0 without.
    """

    requests: int
    prompt_tokens: int
    page_size: int
    prompt_length: Dict[str, float]
    output_length: Dict[str, float]
    distinct_pages: int
    page_references: int
    reuse_distance: List[List[int]]
    first_references: int
    popularity: List[List[int]]
    zipf_alpha: float
    zipf_c: float
    zipf_r2: float
    top_1pct_share: float
    shared_prefix: Dict[str, float]
    requests_sharing: float
    duration_seconds: float
    request_rate: float
    peak_request_rate: float

    def as_dict(self) -> dict:
        return asdict(self)


def profile(requests: Iterable[Request], page_size: int, *, mooncake: bool = False) -> TraceProfile:
    """One pass over ``requests``: see :class:`TraceProfile`. ``mooncake``: pages from Mooncake block ids.

    Raises:
        ArgumentValueError: a request with a namespace (pages are compared across the whole trace),
            or a bad ``page_size``.
    """
    stack = LruStackDistances(page_size)
    prompts: List[int] = []
    outputs: List[int] = []
    shared: List[int] = []
    stamps: List[float] = []
    counts = np.zeros(1024, dtype=np.int64)
    distance = np.zeros(64, dtype=np.int64)
    first = 0
    for i, (request, ids) in enumerate(_page_ids(requests, page_size, mooncake)):
        if request.namespace is not None:
            raise ArgumentValueError(f"requests[{i}] has namespace {request.namespace!r}; analyze compares "
                                     "pages across the whole trace")
        ranks = stack.add(ids, len(request.tokens))
        prompts.append(len(request.tokens))
        outputs.append(request.output_length)
        shared.append(len(ranks) * page_size)
        if request.timestamp is not None:
            stamps.append(request.timestamp)
        first += len(ids) - len(ranks)
        if len(ranks):
            np.add.at(distance, np.floor(np.log2(ranks + 1)).astype(np.int64), 1)
        if len(ids):
            if ids.max() >= len(counts):
                counts = np.concatenate([counts, np.zeros(max(len(counts), int(ids.max()) + 1), dtype=np.int64)])
            counts[ids] += 1  # a request's pages are distinct
    references = int(counts.sum())
    used = counts[counts > 0]
    top = np.sort(used)[::-1][: max(1, len(used) // 100)] if len(used) else used
    buckets = [[(1 << b) - 1, (1 << (b + 1)) - 1, int(n)] for b, n in enumerate(distance) if n]
    fit = zipf_fit(used)
    ranked = np.sort(used)[::-1]
    duration = (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    times = np.asarray(stamps)
    peak = 0.0
    if len(times) > 1:
        ends = np.searchsorted(times, times + RATE_WINDOW_SECONDS, side="left")
        peak = float((ends - np.arange(len(times))).max()) / min(RATE_WINDOW_SECONDS, max(duration, 1e-9))
    return TraceProfile(
        requests=len(prompts), prompt_tokens=int(sum(prompts)), page_size=page_size,
        prompt_length=distribution(np.asarray(prompts, dtype=np.float64)),
        output_length=distribution(np.asarray(outputs, dtype=np.float64)),
        distinct_pages=int(len(used)), page_references=references, reuse_distance=buckets, first_references=first,
        popularity=[[int(r), int(ranked[r - 1])] for r in popularity_ranks(len(ranked))],
        zipf_alpha=fit["alpha"], zipf_c=fit["c"], zipf_r2=fit["r2"],
        top_1pct_share=float(top.sum()) / references if references else 0.0,
        shared_prefix=distribution(np.asarray(shared, dtype=np.float64)),
        requests_sharing=sum(s > 0 for s in shared) / len(shared) if shared else 0.0,
        duration_seconds=float(duration), request_rate=(len(stamps) - 1) / duration if duration > 0 else 0.0,
        peak_request_rate=peak)


def profile_rows(p: TraceProfile) -> List[dict]:
    """The profile as ``{"metric", "value"}`` rows for a table, values as text. O(buckets)."""
    def dist(d: Dict[str, float]) -> str:
        return ", ".join(f"{k} {d[k]:,.0f}" for k in ("mean", "p50", "p90", "p99", "max"))

    reused = p.page_references - p.first_references
    rows = [("requests", f"{p.requests:,} ({p.prompt_tokens:,} prompt tokens, page {p.page_size})"),
            ("prompt tokens", dist(p.prompt_length)),
            ("output tokens", dist(p.output_length) if p.output_length["max"] else "not in the trace"),
            ("pages", f"{p.distinct_pages:,} distinct, {p.page_references:,} references, "
                      f"{reused / max(p.page_references, 1):.1%} re-used"),
            ("page popularity", f"Zipf alpha {p.zipf_alpha:.2f} (R^2 {p.zipf_r2:.2f}); top 1% of pages get "
                                f"{p.top_1pct_share:.1%} of references"),
            ("shared prefix tokens", dist(p.shared_prefix)),
            ("requests sharing", f"{p.requests_sharing:.1%} start with a page seen before"),
            ("request rate", f"{p.request_rate:,.2f}/s over {p.duration_seconds:,.0f} s; busiest minute "
                             f"{p.peak_request_rate:,.2f}/s" if p.duration_seconds else "no timestamps")]
    for low, high, n in p.reuse_distance:
        rows.append((f"reuse distance <{compact(high)}", f"{n:,} references ({n / max(reused, 1):.1%} of re-uses)"))
    return [{"metric": m, "value": v} for m, v in rows]


def plot_profile(p: TraceProfile, counts_title: str, out: str) -> str:
    """Four panels a column wide (prompt lengths, reuse distances, page popularity with its Zipf fit,
    the shared prefix) written to ``out`` (PNG, PDF or SVG by extension). Returns ``out``.

    Raises:
        RuntimeError: matplotlib (the ``plot`` extra) is missing.
    """
    from .plot import COLUMN_INCHES, pyplot

    plt = pyplot()
    import os
    import textwrap

    from matplotlib.ticker import FuncFormatter

    with plt.rc_context({"font.size": 6.5, "axes.linewidth": 0.6}):
        fig, axes = plt.subplots(2, 2, figsize=(COLUMN_INCHES, 3.0))
        keys = ("mean", "p50", "p90", "p99", "max")
        for ax, d, label in ((axes[0, 0], p.prompt_length, "prompt tokens"),
                             (axes[1, 1], p.shared_prefix, "shared prefix tokens")):
            ax.bar(range(len(keys)), [d[k] for k in keys], color="#0072B2")
            ax.set_xticks(range(len(keys)), keys, fontsize=5.5)
            ax.set_title(label, fontsize=6.5)
        ax = axes[0, 1]
        if p.reuse_distance:
            ax.bar(range(len(p.reuse_distance)), [n for _, _, n in p.reuse_distance], color="#009E73")
            step = -(-len(p.reuse_distance) // 5)  # five labels at most: they must not print on each other
            ticks = list(range(0, len(p.reuse_distance), step))
            ax.set_xticks(ticks, [f"<{compact(p.reuse_distance[i][1])}" for i in ticks], fontsize=5.5)
        ax.set_title("reuse distance (pages)", fontsize=6.5)
        ax = axes[1, 0]
        if p.popularity:
            ranks, refs = zip(*p.popularity)
            ax.plot(ranks, refs, "o", markersize=2, color="#D55E00")
            ax.plot(ranks, np.exp(p.zipf_c) * np.asarray(ranks, dtype=float) ** -p.zipf_alpha, color="black",
                    linewidth=0.8, linestyle="--")
        ax.set_title(f"page popularity (Zipf \u03b1 {p.zipf_alpha:.2f})", fontsize=6.5)
        ax.set_xlabel("rank")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for a in (axes[0, 0], axes[0, 1], axes[1, 1]):
            a.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: compact(int(v))))
        for a in axes.flat:
            a.grid(True, alpha=0.3, linewidth=0.5)
        fig.suptitle(textwrap.fill(counts_title, 60), fontsize=7)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        fig.savefig(out, dpi=300)
        plt.close(fig)
    return out
