"""The ``radixkv`` command: replay traces and compare cache configurations.

User errors (bad trace lines, bad options) print one line to stderr and exit
with status 2; there is no traceback for them.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Callable, Optional

import click

from . import policies
from .cache import PrefixCache
from .errors import RadixKVError
from .replay import ReplayResult, replay
from .traces import FORMATS, TraceReader


def user_errors(fn: Callable) -> Callable:
    """Turn radixkv's own errors and ValueErrors into a one-line message and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (RadixKVError, ValueError, OSError) as exc:
            click.echo(f"radixkv: error: {exc}", err=True)
            sys.exit(2)

    return wrapper


def progress(total: Optional[int], quiet: bool, desc: str):
    """A tqdm bar on stderr with rate and ETA; silent when quiet or stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", disable=quiet or not sys.stderr.isatty(),
                mininterval=0.5, dynamic_ncols=True, file=sys.stderr)


def format_table(rows: list, columns: list) -> str:
    """A GitHub-markdown table of ``rows`` (dicts) restricted to ``columns``."""
    def cell(v):
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    cells = [[cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(v.rjust(w) for v, w in zip(row, widths)) + " |" for row in cells]
    return "\n".join(lines)


def positive(ctx, param, value):
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be > 0, got {value!r}")
    return value


def policy_name(ctx, param, value):
    names = policies.available(include_aliases=True)
    if value not in names:
        raise click.BadParameter(f"unknown policy {value!r}; available: {', '.join(names)}")
    return value


@click.group()
@click.version_option(package_name="radixkv")
def main() -> None:
    """radixkv: prefix-cache simulation and replay for LLM KV caches."""


@main.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--policy", default="lru", show_default=True, callback=policy_name, help="Eviction policy.")
@click.option("--page-size", default=16, show_default=True, type=int, callback=positive, help="Tokens per page.")
@click.option("--num-blocks", required=True, type=int, callback=positive, help="Cache capacity in blocks (pages).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help="Trace format (default: detect).")
@click.option("--limit", type=int, default=None, help="Replay only the first N requests.")
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (last line) instead of a table.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--host-blocks", default=0, show_default=True, type=click.IntRange(min=0),
              help="Host-DRAM tier capacity in blocks (0: none).")
@click.option("--write-policy", default="write_back", show_default=True,
              type=click.Choice(["write_back", "write_through", "write_through_selective"]),
              help="How pages reach the lower tiers.")
@click.option("--remote-hosts", default=0, show_default=True, type=click.IntRange(min=0),
              help="Simulated remote hosts (0: none).")
@click.option("--remote-blocks", default=0, show_default=True, type=click.IntRange(min=0),
              help="Blocks per remote host.")
@click.option("--redis", "redis_urls", multiple=True, metavar="URL",
              help="A Redis server as one remote host (repeatable); replaces the simulated hosts.")
@click.option("--load-back", default="cost", show_default=True, type=click.Choice(["cost", "always", "never"]),
              help="Load lower-tier hits when transfer beats recompute, always, or never.")
@user_errors
def replay_cmd(trace, policy, page_size, num_blocks, fmt, limit, skip_bad, as_json, quiet,
               host_blocks, write_policy, remote_hosts, remote_blocks, redis_urls, load_back) -> None:
    """Replay TRACE (token or Mooncake JSONL) through one cache and report hit rates.

    With --host-blocks / --remote-hosts / --redis the cache spills to lower tiers; the JSON then
    adds hit_tokens_by_tier, bytes_by_link, bytes_by_route and transfer_seconds."""
    from .tiers.config import build_cache

    reader = TraceReader(trace, fmt, limit=limit, skip_bad=skip_bad)
    cache = build_cache(num_blocks, page_size, policy, host_blocks=host_blocks, write_policy=write_policy,
                        remote_hosts=remote_hosts, remote_blocks=remote_blocks, redis_urls=redis_urls,
                        load_back=load_back)
    try:
        with progress(limit, quiet, "replay") as bar:
            result = replay(reader, cache, on_request=lambda r, h: bar.update())
    finally:
        if hasattr(cache, "close"):
            cache.close()
    out = result.as_dict()
    out["skipped_lines"] = reader.skipped
    if hasattr(cache, "tier_stats"):
        stats = cache.tier_stats().as_dict()
        out.update(write_policy=write_policy, host_blocks=host_blocks,
                   remote_hosts=len(redis_urls) or remote_hosts, remote_blocks=remote_blocks,
                   **{k: stats[k] for k in ("hit_tokens_by_tier", "bytes_by_link", "bytes_by_route",
                                            "transfer_seconds", "recomputed_tokens", "integrity_misses",
                                            "dropped_pages", "lost_pages")})
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(format_table([out], ["policy", "page_size", "num_blocks", "requests", "prompt_tokens",
                                        "hit_tokens", "token_hit_rate", "evicted_blocks", "wall_seconds"]))
        if reader.skipped:
            click.echo(f"skipped {reader.skipped} malformed lines", err=True)


@main.command("demo")
@click.option("--requests", "num_requests", default=3000, show_default=True, type=int, callback=positive,
              help="Requests in the generated trace.")
@click.option("--seed", default=0, show_default=True, type=int, help="Trace seed.")
@click.option("--page-size", default=16, show_default=True, type=int, callback=positive, help="Tokens per page.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@user_errors
def demo_cmd(num_requests, seed, page_size, quiet) -> None:
    """Replay a generated mixed workload (chat, RAG, agents, shared prompts, scans) through every
    policy at three capacities and print the hit-rate table. Needs no trace file and no server."""
    from .generators import generate

    requests = list(generate("mix", seed, num_requests))
    prompt_tokens = sum(len(r.tokens) for r in requests)
    pages = prompt_tokens // page_size
    capacities = [max(1, pages // 100), max(1, pages // 20), max(1, pages // 5)]
    click.echo(f"trace: mix, {len(requests)} requests, {prompt_tokens} prompt tokens, seed {seed}")
    rows = []
    runs = [(p, c) for c in capacities for p in policies.available() if p != "belady"]
    with progress(len(runs) * len(requests), quiet, "demo") as bar:
        for policy, capacity in runs:
            cache = PrefixCache(num_blocks=capacity, page_size=page_size, policy=policy)
            result = replay(requests, cache, on_request=lambda r, h: bar.update())
            rows.append(result.as_dict())
    click.echo(format_table(rows, ["policy", "num_blocks", "requests", "hit_tokens", "token_hit_rate",
                                   "evicted_blocks", "wall_seconds"]))


@main.command("cluster")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--instances", default=4, show_default=True, type=int, callback=positive, help="Serving instances.")
@click.option("--num-blocks", required=True, type=int, callback=positive, help="HBM blocks per instance.")
@click.option("--host-blocks", default=0, show_default=True, type=click.IntRange(min=0),
              help="Host-tier blocks per instance (0: none).")
@click.option("--routing", default="round_robin", show_default=True,
              type=click.Choice(["round_robin", "least_loaded", "cache_aware"]), help="Request routing.")
@click.option("--borrowing/--no-borrowing", default=False, show_default=True,
              help="Lend spare HBM between instances (Infinite-LLM).")
@click.option("--lend-cap", default=0.5, show_default=True, type=click.FloatRange(0, 1),
              help="Share of its blocks an instance may lend.")
@click.option("--low-watermark", default=0.05, show_default=True, type=click.FloatRange(0, 1),
              help="Share of its blocks a creditor keeps free.")
@click.option("--policy", default="lru", show_default=True, callback=policy_name, help="Eviction policy.")
@click.option("--page-size", default=16, show_default=True, type=int, callback=positive, help="Tokens per page.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help="Trace format (default: detect).")
@click.option("--limit", type=int, default=None, help="Replay only the first N requests.")
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (last line) instead of a table.")
@user_errors
def cluster_cmd(trace, instances, num_blocks, host_blocks, routing, borrowing, lend_cap, low_watermark,
                policy, page_size, fmt, limit, skip_bad, as_json) -> None:
    """Replay TRACE across a cluster of caches with request routing and (optionally) memory lending."""
    from .cluster import Cluster

    cluster = Cluster(instances, num_blocks, page_size, policy, host_blocks=host_blocks, borrowing=borrowing,
                      routing=routing, lend_cap=lend_cap, low_watermark=low_watermark)
    out = cluster.replay(TraceReader(trace, fmt, limit=limit, skip_bad=skip_bad)).as_dict()
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(format_table([out], ["routing", "borrowing", "instances", "num_blocks", "requests",
                                        "hit_tokens", "token_hit_rate", "bytes_lent", "wall_seconds"]))


def result_row(result: ReplayResult) -> dict:
    return result.as_dict()


if __name__ == "__main__":  # pragma: no cover
    main()
