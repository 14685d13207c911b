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
@user_errors
def replay_cmd(trace, policy, page_size, num_blocks, fmt, limit, skip_bad, as_json, quiet) -> None:
    """Replay TRACE (token or Mooncake JSONL) through one cache and report hit rates."""
    reader = TraceReader(trace, fmt, limit=limit, skip_bad=skip_bad)
    cache = PrefixCache(num_blocks=num_blocks, page_size=page_size, policy=policy)
    with progress(limit, quiet, "replay") as bar:
        result = replay(reader, cache, on_request=lambda r, h: bar.update())
    out = result.as_dict()
    out["skipped_lines"] = reader.skipped
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


def result_row(result: ReplayResult) -> dict:
    return result.as_dict()


if __name__ == "__main__":  # pragma: no cover
    main()
