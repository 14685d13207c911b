"""The ``radixkv`` command: replay traces and compare cache configurations.

User errors (bad trace lines, bad options) print one line to stderr and exit
with status 2; there is no traceback for them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import warnings
from typing import Callable, Iterable, List, Optional

import click

from . import policies
from .cache import PrefixCache
from .capacity import describe, parse_capacity, resolve_blocks
from .costs import DEFAULT_HARDWARE, DEFAULT_MODEL, MODELS
from .errors import ArgumentValueError, RadixKVError
from .keys import check_int
from .analysis.output import OUTPUT_FORMATS, figure, pick_columns, render, to_json
from .analysis.replay import ReplayResult, replay
from .workload.sources import TRACE_FORMATS, open_trace
from .workload.tracefiles import replacing
from .workload.traces import Request
from .analysis.stats import MISS_REASONS
from .workload.limits import (MAX_CAPACITY_BLOCKS, MAX_CLUSTER_BLOCKS, MAX_EVENT_LAG, MAX_HELD_REQUESTS,
                              MAX_HELD_TOKENS, MAX_INSTANCES, MAX_ITEMS, MAX_JOBS, MAX_PAGE_SIZE, MAX_REMOTE_HOSTS,
                              MAX_REQUESTS, MAX_TENANTS, check_at_most, spell)

TABLE_WIDTH = 100
"""Default tables drop their rightmost default columns until they fit this many characters."""


def user_errors(fn: Callable) -> Callable:
    """Turn radixkv's own errors and ValueErrors into a one-line message and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:  # `radixkv replay T | head -1`: the reader has stopped, not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            sys.exit(0)
        except (RadixKVError, ValueError, TypeError, OSError) as exc:
            click.echo(f"radixkv: error: {exc}", err=True)
            sys.exit(2)

    return wrapper


@contextlib.contextmanager
def naming(what: str, path: str):
    """Run the block, an ``OSError`` it raises (a missing file, a folder that cannot be made) turned
    into an :class:`ArgumentValueError` naming ``what`` (the flag or argument) and ``path``. O(1)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise ArgumentValueError(f"{what} {path}: {(exc.strerror or str(exc)).lower()}") from None


def output_file(flag: str, path: Optional[str]) -> Optional[str]:
    """``path`` of an output flag (``-o``, ``--records``), its missing parent folders created as
    ``gen -o`` and ``plot -o`` do, so a run never fails at its end for want of a folder; errors name
    ``flag``. ``None`` and ``-`` (stdout) pass. O(depth of the path)."""
    if path and path != "-":
        with naming(flag, path):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            if os.path.isdir(path):
                raise IsADirectoryError(21, "Is a directory")
    return path


def progress(total: Optional[int], quiet: bool, desc: str, unit: str = "req"):
    """A tqdm bar on stderr with rate and ETA; silent when quiet or stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=quiet or not sys.stderr.isatty(),
                mininterval=0.5, dynamic_ncols=True, file=sys.stderr)


class RadixKVGroup(click.Group):
    """The command group whose usage errors (bad option values, missing arguments) print one line,
    ``radixkv: error: ...`` naming the option, like radixkv's own errors, and exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            message = " ".join(exc.format_message().split())
            click.echo(f"radixkv: error: {message}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("radixkv: error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def output_options(fn: Callable) -> Callable:
    """``--format`` (output table|md|csv|json, or a trace format for compatibility), ``--trace-format``,
    ``--json`` (= ``--format json``) and ``--columns``."""
    fn = click.option("--columns", default=None, metavar="A,B,...",
                      help="Table columns to show (any key of the JSON output, e.g. wall_seconds).")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Same as --format json.")(fn)
    fn = click.option("--trace-format", "trace_fmt", type=click.Choice(TRACE_FORMATS), default=None,
                      help="Trace format (default: detect).")(fn)
    return click.option("--format", "fmt", type=click.Choice(OUTPUT_FORMATS + TRACE_FORMATS), default=None,
                        help="Output: table (default), md, csv or json. (A trace format name here is the "
                             "older spelling of --trace-format.)")(fn)


def formats(fmt: Optional[str], trace_fmt: Optional[str], as_json: bool) -> tuple:
    """(output format, trace format) from ``--format``, ``--trace-format`` and ``--json``."""
    if fmt in TRACE_FORMATS:
        if trace_fmt not in (None, fmt):
            raise ArgumentValueError(f"--format {fmt} and --trace-format {trace_fmt} disagree")
        fmt, trace_fmt = None, fmt
    if as_json and fmt not in (None, "json"):
        raise ArgumentValueError(f"--json and --format {fmt} disagree")
    return ("json" if as_json else fmt or "table"), trace_fmt


def fit_columns(rows: list, columns: list, explicit: bool) -> list:
    """``columns``, less the rightmost ones while the table is wider than :data:`TABLE_WIDTH`
    (never when the user chose them)."""
    columns = list(columns)
    def width() -> int:
        return max(map(len, render(rows, columns, "table").splitlines()))

    while not explicit and len(columns) > 2 and width() > TABLE_WIDTH:
        columns.pop()
    return columns


def show(rows: list, columns: list, fmt: str, spec: Optional[str]) -> None:
    """Print ``rows`` in ``fmt``: the default ``columns`` fitted to the width, or those of ``--columns``."""
    chosen = pick_columns(spec, columns, rows)
    click.echo(render(rows, chosen if fmt != "table" else fit_columns(rows, chosen, bool(spec)), fmt))


def tokenizer_option(fn: Callable) -> Callable:
    """``--tokenizer PATH``: a local ``tokenizer.json`` for ShareGPT text."""
    return click.option("--tokenizer", "tokenizer_path", default=None, metavar="PATH",
                        help="A local tokenizer.json for ShareGPT text, read with the tokenizers library "
                             "(pip install 'radixkv[tokenizers]'); default: the built-in tokenizer.")(fn)


SHAREGPT_META = "radixkv.sharegpt"
"""Where ``--sessions`` and ``--request-rate`` keep their values in the click context (:func:`sharegpt_shape`)."""


def sharegpt_options(fn: Callable) -> Callable:
    """``--sessions N`` and ``--request-rate R``: how a ShareGPT trace's conversations interleave
    (:func:`radixkv.workload.sharegpt.load_sharegpt`). They reach :func:`cli_trace` through the
    context, so a command's signature does not change."""
    def keep(check: Callable) -> Callable:
        def callback(ctx, param, value):
            value = check(ctx, param, value)
            if value is not None:
                ctx.meta.setdefault(SHAREGPT_META, {})[param.name] = value
            return value
        return callback

    def rate(ctx, param, value):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise click.BadParameter(f"must be finite and > 0, got {value!r}")
        return value

    fn = click.option("--request-rate", "request_rate", type=float, default=None, expose_value=False,
                      callback=keep(rate), help="ShareGPT: requests per second of the synthetic arrival times "
                                                "(default 1).")(fn)
    return click.option("--sessions", "num_sessions", type=int, default=None, expose_value=False,
                        callback=keep(bounded(MAX_ITEMS)),
                        help=f"ShareGPT: conversations open at once, their turns interleaved round robin "
                             f"(default 16; at most {spell(MAX_ITEMS)}).")(fn)


def sharegpt_shape() -> dict:
    """The ``--sessions`` / ``--request-rate`` given to the running command, as ``open_trace`` keywords."""
    ctx = click.get_current_context(silent=True)
    return dict(ctx.meta.get(SHAREGPT_META, {})) if ctx is not None else {}


def cli_trace(trace: str, trace_fmt: Optional[str], limit: Optional[int], skip_bad: bool,
              tokenizer_path: Optional[str] = None):
    """:func:`open_trace` for a command, with ``--tokenizer``, ``--sessions`` and ``--request-rate``
    (their errors name the flag, and a file that cannot be read names TRACE)."""
    shape = sharegpt_shape()
    with naming("TRACE", trace):
        reader = open_trace(trace, trace_fmt, limit=limit, skip_bad=skip_bad, **shape)
    if shape and reader.format != "sharegpt":
        flags = " and ".join({"num_sessions": "--sessions", "request_rate": "--request-rate"}[k] for k in shape)
        raise ArgumentValueError(f"{flags} shape ShareGPT conversations; {trace} is a {reader.format} trace")
    if tokenizer_path is None:
        return reader
    if reader.format != "sharegpt":
        raise ArgumentValueError(f"--tokenizer applies to text (ShareGPT) traces; {trace} is a {reader.format} "
                                 "trace of token ids")
    from .workload.hf_tokenizer import load_tokenizer

    return open_trace(reader.path, reader.format, limit=limit, skip_bad=skip_bad,
                      tokenizer=load_tokenizer(tokenizer_path, "--tokenizer"), **shape)


def capacity_options(what: str) -> Callable:
    """``--num-blocks`` / ``--max-total-tokens`` / ``--kv-cache-memory``: one size, three units."""
    def decorate(fn: Callable) -> Callable:
        fn = click.option("--kv-cache-memory", default=None, metavar="BYTES",
                          help=f"{what} as KV bytes of --model, e.g. 40GiB or 40GB (vLLM's "
                               f"--kv-cache-memory-bytes); at most {CAPACITY_BOUND}.")(fn)
        fn = click.option("--max-total-tokens", default=None, metavar="TOKENS",
                          help=f"{what} in tokens, e.g. 3000000 or 3M (SGLang's --max-total-tokens); at most "
                               f"{CAPACITY_BOUND}.")(fn)
        return click.option("--num-blocks", default=None, metavar="BLOCKS",
                            help=f"{what} in blocks (pages), e.g. 187500 or 187.5k; at most {CAPACITY_BOUND}. "
                                 "Give exactly one of the three.")(fn)
    return decorate


CAPACITY_FLAGS = ("--num-blocks", "--max-total-tokens", "--kv-cache-memory")
CAPACITY_BOUND = f"{spell(MAX_CAPACITY_BLOCKS)} blocks"
"""How a capacity's help and errors state :data:`~radixkv.workload.limits.MAX_CAPACITY_BLOCKS`."""


def capped(flag: str, text: object, blocks: int) -> int:
    """``blocks``, what ``flag`` given ``text`` comes to, if one cache may have that many
    (:data:`~radixkv.workload.limits.MAX_CAPACITY_BLOCKS`), else an error naming the flag. O(1)."""
    if blocks > MAX_CAPACITY_BLOCKS:
        raise ArgumentValueError(f"{flag} {text} is {blocks:,} blocks; a cache may have at most {CAPACITY_BOUND}")
    return blocks


def cli_blocks(num_blocks, max_total_tokens, kv_cache_memory, page_size: int, model: str) -> int:
    """The capacity options as blocks (errors name the flag)."""
    blocks = resolve_blocks(num_blocks=num_blocks, max_total_tokens=max_total_tokens, kv_cache_memory=kv_cache_memory,
                            page_size=page_size, model=model, names=CAPACITY_FLAGS)
    flag, text = next((f, v) for f, v in zip(CAPACITY_FLAGS, (num_blocks, max_total_tokens, kv_cache_memory))
                      if v is not None)
    return capped(flag, text, blocks)


def tier_blocks(flag: str, text: str, page_size: int, model: str) -> int:
    """A lower tier's size: ``0`` (none), or blocks / tokens (``3Mtok``) / bytes (``64GiB``)."""
    if str(text).strip() == "0":
        return 0
    return capped(flag, text, parse_capacity(text, page_size=page_size, model=model, name=flag))


def capacity_line(num_blocks: int, page_size: int, model: Optional[str]) -> str:
    """``187,500 blocks = 3,000,000 tokens = 366.2 GiB of llama-3-8b KV``."""
    size = describe(num_blocks, page_size, model)
    gib = f" = {figure(size['capacity_gib'])} GiB of {model} KV" if model else ""
    return f"{num_blocks:,} blocks = {size['capacity_tokens']:,} tokens{gib}"


def with_capacity(row: dict, model: Optional[str]) -> dict:
    """``row`` plus ``capacity_tokens`` (and ``capacity_gib`` with a model) for a table."""
    return {**row, **describe(row["num_blocks"], row["page_size"], model)}


def bounded(maximum: int, minimum: int = 1) -> Callable:
    """Click callback for an int option: its value if in ``[minimum, maximum]``, else a usage error
    naming the option (one line, exit 2). The bounds are :mod:`radixkv.workload.limits`'; the
    option's help states ``maximum``. O(1)."""
    def check(ctx, param, value):
        if value is None:
            return None
        try:
            value = check_int(value, param.name, minimum=minimum, bound="> 0" if minimum == 1 else None)
            return check_at_most(value, param.name, maximum)
        except ArgumentValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return check


def page_size_option(fn: Callable) -> Callable:
    """``--page-size``: tokens per page, at most :data:`~radixkv.workload.limits.MAX_PAGE_SIZE`."""
    return click.option("--page-size", default=16, show_default=True, type=int, callback=bounded(MAX_PAGE_SIZE),
                        help=f"Tokens per page (at most {spell(MAX_PAGE_SIZE)}).")(fn)


def limit_option(verb: str) -> Callable:
    """``--limit N``: ``verb`` only the first N requests (at most :data:`~radixkv.workload.limits.MAX_REQUESTS`)."""
    return click.option("--limit", default=None, type=int, callback=bounded(MAX_REQUESTS, minimum=0),
                        help=f"{verb} only the first N requests (at most {spell(MAX_REQUESTS)}).")


POLICY_HELP = f"Eviction policy: {', '.join(policies.available())}; or a class of yours as module:Class."
"""``--policy``'s help: every registered name (an alias is accepted too)."""


def warmup_option(fn: Callable) -> Callable:
    """``--warmup N|P%``: requests that fill the cache before anything is counted."""
    return click.option("--warmup", default="0", show_default=True, metavar="N|P%",
                        help=f"Requests that fill the cache before anything is counted: a count (500) or a share "
                             f"of the trace (10%); at most {spell(MAX_REQUESTS)}.")(fn)


def cli_warmup(text: str, reader) -> int:
    """``--warmup`` as a count of requests; a share counts the trace's requests (one fast read of a
    JSONL file, a pass over a ShareGPT one). Errors name the flag. O(1), or that read."""
    text = str(text).strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 <= share < 100:
            raise ArgumentValueError(f"--warmup: a share must be in [0%, 100%), got {text!r}")
        total = reader.size_hint() if reader.format != "sharegpt" else None
        if total is None:
            total = sum(1 for _ in reader)
        return int(total * share / 100)
    try:
        count = int(text)
    except ValueError:
        raise ArgumentValueError(f"--warmup must be a count of requests or a share (10%), got {text!r}") from None
    return check_at_most(check_int(count, "--warmup", minimum=0), "--warmup", MAX_REQUESTS)


def interval_option(fn: Callable) -> Callable:
    """``--interval N``: the hit rate over time, one window per N counted requests."""
    return click.option("--interval", default=None, type=int, callback=bounded(MAX_REQUESTS),
                        help=f"Record the hit rate over time: one window per N requests, in the JSON's "
                             f"'intervals' (radixkv plot --over-time draws them); at most {spell(MAX_REQUESTS)}.")(fn)


def counted(requests: int, warmup: int) -> None:
    """Refuse a run whose warm-up left nothing to count, naming ``--warmup``. O(1)."""
    if warmup and not requests:
        raise ArgumentValueError(f"--warmup {warmup:,} leaves no request to count: the trace has no more")


def policy_param_option(fn: Callable) -> Callable:
    """``--policy-param KEY=VALUE`` (repeatable): a constructor argument of the policy."""
    return click.option("--policy-param", "policy_params", multiple=True, metavar="KEY=VALUE",
                        help="A constructor argument of the policy (repeatable), e.g. small_fraction=0.2 for "
                             "s3fifo; values are JSON or text, checked against the constructor.")(fn)


def policy_specs(names: List[str], params: tuple) -> dict:
    """``--policy-param`` as each of ``names``' ``((key, value), ...)``: a key goes to the policies whose
    constructor takes it, and must go to one at least; the values are checked by building each
    (:meth:`radixkv.policies.PolicySpec.check`). Errors name the flag. JSON lists become tuples."""
    kwargs = gen_params(params, "--policy-param")
    pairs = [(k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()]
    out = {}
    try:
        for name in names if pairs else ():
            takes = policies.parameters(name)
            out[name] = tuple((k, v) for k, v in pairs if k in takes)
        for key, _ in pairs:
            if not any(key in dict(given) for given in out.values()):
                takes = "; ".join(f"{n}: {', '.join(policies.parameters(n)) or 'none'}" for n in names)
                raise ArgumentValueError(f"no policy of {', '.join(names)} takes {key!r} (they take {takes})")
        for name, given in out.items():
            if given:
                policies.PolicySpec(name, given).check()
    except RadixKVError as exc:
        raise ArgumentValueError(f"--policy-param: {exc}") from None
    return out


def policy_name(ctx, param, value):
    if ":" in value:  # a user's class: imported now, so a bad path fails before any work
        try:
            policies.load(value)
        except RadixKVError as exc:
            raise click.BadParameter(str(exc)) from None
        return value
    names = policies.available(include_aliases=True)
    if value not in names:
        raise click.BadParameter(f"unknown policy {value!r}; available: {', '.join(names)}")
    return value


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one), at most
    :data:`~radixkv.workload.limits.MAX_JOBS`: the default of ``sweep --jobs``. O(1)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(count, MAX_JOBS))


def bar_total(trace, quiet: bool) -> Optional[int]:
    """Requests to expect when a progress bar will show (for its ETA), else ``None`` (no extra read)."""
    return None if quiet or not sys.stderr.isatty() else trace.size_hint()


def cost_options(fn: Callable) -> Callable:
    """The --model / --hardware / --no-miss-reasons options of the replaying commands."""
    from .costs import HARDWARE, MODELS

    fn = click.option("--miss-reasons/--no-miss-reasons", default=True, show_default=True,
                      help="Classify missed tokens by reason (memory: 8 bytes per distinct page).")(fn)
    fn = click.option("--hardware", default=DEFAULT_HARDWARE, show_default=True, type=click.Choice(sorted(HARDWARE)),
                      help="Accelerator for the TTFT saving estimate.")(fn)
    return click.option("--model", default=DEFAULT_MODEL, show_default=True, type=click.Choice(sorted(MODELS)),
                        help="Model for the prefill FLOPs / TTFT saving estimates.")(fn)


def records_option(fn: Callable) -> Callable:
    """``--records FILE``: one JSON line per request."""
    return click.option("--records", type=click.Path(dir_okay=False, writable=True), default=None,
                        help="Write one JSON record per request (hits, misses by reason, evictions) to this "
                             "file; it is replaced only when the run succeeds.")(fn)


@contextlib.contextmanager
def records_writer(path: Optional[str]):
    """``write(record, **extra)`` appending one JSON line per request to ``path``, or ``None`` without one.
    ``path`` is replaced only when the run ends without an error (:func:`~radixkv.workload.tracefiles.replacing`)."""
    if not path:
        yield None
        return
    with replacing(output_file("--records", path)) as sink:
        yield lambda record, **extra: sink.write(to_json({**record.as_dict(), **extra}) + "\n")


def show_savings(out: dict, out_fmt: str) -> None:
    """The tail of a replay's table: missed tokens by reason (when classified) and the prefill saved."""
    if out.get("miss_tokens_by_reason"):
        click.echo()
        show(miss_rows(out), ["miss_reason", "tokens", "share_of_prompt"], out_fmt, None)
    click.echo(f"\nprefill saved: {figure(out['prefill_flops_saved'] / 1e15)} PFLOP, "
               f"{figure(out['ttft_saving_seconds'])} s of TTFT ({out['model']} on {out['hardware']})")


def miss_rows(result: dict) -> list:
    """Rows (reason, tokens, share of prompt tokens) of a replay result's misses, hits first."""
    prompt = result["prompt_tokens"] or 1
    rows = [{"miss_reason": "(hit)", "tokens": result["hit_tokens"], "share_of_prompt": result["hit_tokens"] / prompt}]
    misses = result.get("miss_tokens_by_reason") or {}
    return rows + [{"miss_reason": r, "tokens": misses[r], "share_of_prompt": misses[r] / prompt}
                   for r in MISS_REASONS if r in misses]


@click.group(cls=RadixKVGroup)
@click.version_option(package_name="radixkv")
def main() -> None:
    """radixkv: prefix-cache simulation and replay for LLM KV caches."""


@main.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--policy", default="lru", show_default=True, callback=policy_name, help=POLICY_HELP)
@page_size_option
@capacity_options("HBM cache capacity")
@output_options
@limit_option("Replay")
@warmup_option
@interval_option
@policy_param_option
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--host-blocks", default="0", show_default=True, metavar="SIZE",
              help=f"Host-DRAM tier capacity: blocks, tokens (3Mtok) or bytes (64GiB), at most {CAPACITY_BOUND}; "
                   "0: none.")
@click.option("--write-policy", default="write_back", show_default=True,
              type=click.Choice(["write_back", "write_through", "write_through_selective"]),
              help="How pages reach the lower tiers.")
@click.option("--remote-hosts", default=0, show_default=True, type=int, callback=bounded(MAX_REMOTE_HOSTS, minimum=0),
              help=f"Simulated remote hosts (at most {spell(MAX_REMOTE_HOSTS)}; 0: none).")
@click.option("--remote-blocks", default="0", show_default=True, metavar="SIZE",
              help=f"Capacity per remote host: blocks, tokens (3Mtok) or bytes (64GiB), at most {CAPACITY_BOUND}.")
@click.option("--redis", "redis_urls", multiple=True, metavar="URL",
              help=f"A Redis server as one remote host (repeatable, at most {spell(MAX_REMOTE_HOSTS)} times); "
                   "replaces the simulated hosts.")
@click.option("--load-back", default="cost", show_default=True, type=click.Choice(["cost", "always", "never"]),
              help="Load lower-tier hits when transfer beats recompute, always, or never.")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="A shared page store read past the cache's own pages and written through at each release: "
                   "memory (in-process), memory://NAME, or redis://HOST:PORT[/DB] (a server or a cluster).")
@click.option("--store-blocks", default=None, type=int, callback=bounded(MAX_CAPACITY_BLOCKS),
              help=f"Pages an in-process --store holds at most (least recently used go first; at most "
                   f"{CAPACITY_BOUND}).")
@records_option
@click.option("--kv-events-endpoint", default=None, metavar="ZMQ",
              help="Publish KV events in vLLM's ZMQ format (e.g. tcp://*:5557), one batch per request.")
@click.option("--kv-events-replay-endpoint", default=None, metavar="ZMQ",
              help="With --kv-events-endpoint: answer vLLM-style replay requests here.")
@tokenizer_option
@sharegpt_options
@cost_options
@user_errors
def replay_cmd(trace, policy, page_size, num_blocks, max_total_tokens, kv_cache_memory, fmt, trace_fmt, as_json,
               columns, limit, skip_bad, quiet, host_blocks, write_policy, remote_hosts, remote_blocks, redis_urls,
               load_back, store_url, store_blocks, records, kv_events_endpoint, kv_events_replay_endpoint, tokenizer_path, model, hardware,
               miss_reasons, warmup, interval, policy_params) -> None:
    """Replay TRACE (token, Mooncake or ShareGPT; plain, .gz, .zst or - for stdin) through one
    cache and report hit rates, misses by reason and the prefill compute saved.

    Capacity: exactly one of --num-blocks, --max-total-tokens, --kv-cache-memory.
    With --host-blocks / --remote-hosts / --redis the cache spills to lower tiers; the table and
    the JSON then add hit_tokens_by_tier, bytes_by_link, bytes_by_route and transfer_seconds."""
    from .events.wire import publish_from
    from .tiers.config import build_cache, open_store

    out_fmt, trace_fmt = formats(fmt, trace_fmt, as_json)
    num_blocks = cli_blocks(num_blocks, max_total_tokens, kv_cache_memory, page_size, model)
    host_blocks = tier_blocks("--host-blocks", host_blocks, page_size, model)
    remote_blocks = tier_blocks("--remote-blocks", remote_blocks, page_size, model)
    check_remote_flags(remote_hosts, remote_blocks, redis_urls)
    reader = cli_trace(trace, trace_fmt, limit, skip_bad, tokenizer_path)
    warmup = cli_warmup(warmup, reader)
    params = policy_specs([policy], policy_params).get(policy, ())
    policy_arg = policies.PolicySpec(policy, params) if params else policy
    publisher = kv_events_publisher(kv_events_endpoint, kv_events_replay_endpoint, write_policy)
    store = store_for(store_url, store_blocks, page_size)
    cache = build_cache(num_blocks, page_size, policy_arg, host_blocks=host_blocks, write_policy=write_policy,
                        remote_hosts=remote_hosts, remote_blocks=remote_blocks, redis_urls=redis_urls,
                        load_back=load_back, enable_events=publisher is not None, store=store)
    try:
        with records_writer(records) as on_record, progress(bar_total(reader, quiet), quiet, "replay") as bar, \
                warnings.catch_warnings():
            # A failing tier warns through Python's warnings; its counters are reported below instead.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"radixkv\.tiers(\.|$)")

            def on_request(request, hit):
                bar.update()
                if publisher is not None:
                    publish_from(cache, publisher)

            result = replay(reader, cache, on_request=on_request, on_record=on_record,
                            miss_reasons=miss_reasons, model=model, hardware=hardware, warmup=warmup,
                            interval=interval or 0)
    finally:
        if publisher is not None:
            publisher.close()
        if hasattr(cache, "close"):
            cache.close()
    counted(result.requests, warmup)
    out = result.as_dict()
    out["skipped_lines"] = reader.skipped
    if params:
        out["policy_params"] = dict(params)
    tiered = hasattr(cache, "tier_stats")
    if tiered:
        stats = cache.tier_stats().as_dict()
        out.update(write_policy=write_policy, host_blocks=host_blocks,
                   remote_hosts=len(redis_urls) or remote_hosts, remote_blocks=remote_blocks,
                   **{k: stats.get(k, 0) for k in ("hit_tokens_by_tier", "bytes_by_link", "bytes_by_route",
                                                   "transfer_seconds", "recomputed_tokens", "integrity_misses",
                                                   "dropped_pages", "lost_pages")},
                   **tier_faults(cache.tiers))
    if store is not None:
        out.update(store=store_url, store_stats={k: v for k, v in store.stats().items() if isinstance(v, int)})
    if out_fmt == "json":
        show([out], REPLAY_COLUMNS, out_fmt, columns)
    elif out_fmt == "csv" or columns:
        show(sweep_table_rows([out], model), REPLAY_COLUMNS, out_fmt, columns)
    else:
        show(sweep_table_rows([out], model), REPLAY_COLUMNS, out_fmt, None)
        warm = f" (after a warm-up of {result.warmup_requests:,})" if result.warmup_requests else ""
        click.echo(f"\n{result.requests:,} requests{warm}, {result.prompt_tokens:,} prompt tokens\n"
                   f"capacity: {capacity_line(num_blocks, page_size, model)}")
        if tiered:
            click.echo()
            show([tier_row(out)], TIER_COLUMNS, out_fmt, None)
            click.echo(tier_traffic(out))
        show_savings(out, out_fmt)
    if reader.skipped and out_fmt != "json":
        click.echo(f"skipped {reader.skipped} malformed lines", err=True)
    if tiered and (out["lost_hosts"] or out["backend_errors"]):
        click.echo(f"radixkv: warning: {fault_summary(out)}", err=True)


def store_for(url: Optional[str], store_blocks: Optional[int], page_size: int):
    """The page store of ``--store`` (``None`` without one), checked as the flags name it."""
    from .tiers.config import open_store

    if url is None:
        if store_blocks is not None:
            raise ArgumentValueError("--store-blocks needs a --store to bound (memory, or redis://HOST:PORT)")
        return None
    try:
        return open_store(url, page_size, store_blocks=store_blocks)
    except ArgumentValueError as exc:
        raise ArgumentValueError(f"--store: {exc}") from None


def check_remote_flags(remote_hosts: int, remote_blocks: int, redis_urls: tuple) -> None:
    """Refuse inconsistent remote-tier flags, or more --redis URLs than remote hosts may be, naming the flags."""
    if len(redis_urls) > MAX_REMOTE_HOSTS:
        raise ArgumentValueError(f"--redis given {len(redis_urls):,} times; at most {spell(MAX_REMOTE_HOSTS)} "
                                 "remote hosts")
    if redis_urls and remote_hosts and remote_hosts != len(redis_urls):
        raise ArgumentValueError(f"--remote-hosts {remote_hosts} does not match the {len(redis_urls)} --redis "
                                 "URL(s): each URL is one remote host")
    if (remote_hosts or redis_urls) and not remote_blocks:
        flag = "--redis" if redis_urls else "--remote-hosts"
        raise ArgumentValueError(f"{flag} needs --remote-blocks N (page slots per remote host), got none")
    if remote_blocks and not (remote_hosts or redis_urls):
        raise ArgumentValueError(f"--remote-blocks {remote_blocks} needs --remote-hosts N or --redis URL")


def tier_faults(tiers: list) -> dict:
    """``backend_errors`` (failed backend calls), ``lost_hosts`` (remote hosts found dead, by URL when the
    backend has them) and ``last_backend_error`` of the lower tiers. Counters are read by name, and a tier
    without them counts nothing."""
    errors, lost, last = 0, [], None
    for tier in tiers:
        errors += int(getattr(tier, "backend_errors", 0) or 0)
        last = getattr(tier, "last_backend_error", None) or last
        urls = getattr(getattr(tier, "backend", None), "urls", None) or []
        for host in getattr(tier, "lost_hosts", None) or []:
            lost.append(urls[host] if 0 <= host < len(urls) else f"{tier.name} host {host}")
    return {"backend_errors": errors, "lost_hosts": lost,
            "last_backend_error": None if last is None else repr(last)[:200]}


REPLAY_COLUMNS = ["policy", "num_blocks", "capacity_tokens", "capacity_gib", "hit_tokens", "token_hit_rate",
                  "request_hit_rate", "ttft_saving_seconds", "evicted_blocks", "prefill_pflops_saved"]
"""A replay's table and CSV columns: a sweep's (:data:`SWEEP_COLUMNS`), so the two CSVs stack."""
TIER_COLUMNS = ["hit_tokens_by_tier", "dropped_pages", "lost_pages", "lost_hosts", "backend_errors"]


def tier_row(out: dict) -> dict:
    """The tier table's row of a replay's JSON: hits as ``hbm 4, host 4``, lost hosts counted."""
    hits = ", ".join(f"{tier} {tokens:,}" for tier, tokens in out["hit_tokens_by_tier"].items())
    return {**out, "hit_tokens_by_tier": hits, "lost_hosts": len(out["lost_hosts"])}


def tier_traffic(out: dict) -> str:
    """One line on what the lower tiers moved: bytes by link, transfer time, recomputes."""
    links = ", ".join(f"{link} {figure(moved / 2**30)}" for link, moved in (out.get("bytes_by_link") or {}).items())
    return (f"moved GiB: {links or 'none'}; transfers {figure(out['transfer_seconds'])} s; "
            f"{out['recomputed_tokens']:,} tokens recomputed; {out['integrity_misses']:,} integrity misses")


def fault_summary(out: dict) -> str:
    """One line on what failed below HBM during a replay and what it cost."""
    parts = []
    if out["lost_hosts"]:
        parts.append(f"remote host(s) lost: {', '.join(out['lost_hosts'])} ({out['lost_pages']} pages lost)")
    if out["backend_errors"]:
        parts.append(f"{out['backend_errors']} remote backend call(s) failed (last: {out['last_backend_error']})")
    return "; ".join(parts) + "; those pages were recomputed, so the hit rates are below a healthy run's"


def kv_events_publisher(endpoint: Optional[str], replay_endpoint: Optional[str], write_policy: str):
    """The ZMQ publisher ``--kv-events-endpoint`` asks for, or ``None``; exit 2 without pyzmq/msgspec."""
    if endpoint is None:
        if replay_endpoint is not None:
            raise click.UsageError("--kv-events-replay-endpoint needs --kv-events-endpoint")
        return None
    from .events.wire import ZmqEventPublisher

    try:
        return ZmqEventPublisher(endpoint, replay_endpoint=replay_endpoint,
                                 exclusive_tiers=write_policy == "write_back")
    except ImportError as exc:
        raise click.UsageError(str(exc)) from exc


@main.command("demo")
@click.option("--requests", "num_requests", default=3000, show_default=True, type=int,
              callback=bounded(MAX_HELD_REQUESTS), help=f"Requests in the generated trace (at most "
                                                        f"{spell(MAX_HELD_REQUESTS)}: the demo holds them all).")
@click.option("--seed", default=0, show_default=True, type=int, help="Trace seed.")
@page_size_option
@click.option("--out-dir", default="out", show_default=True, type=click.Path(file_okay=False),
              help="Where to write demo.jsonl (one line per run) and demo.png.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--format", "fmt", type=click.Choice(OUTPUT_FORMATS), default="table", show_default=True,
              help="Output of the sweep table.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--columns", default=None, metavar="A,B,...", help="Table columns to show.")
@user_errors
def demo_cmd(num_requests, seed, page_size, out_dir, quiet, fmt, as_json, columns) -> None:
    """Replay a generated mixed workload (chat, RAG, agents, shared prompts, scans) through every
    policy at five capacities, print the sweep table and plot hit rate against capacity (Belady
    is the ceiling). Needs no trace file and no server."""
    from .workload.generators import generate
    from .analysis.sweep import trace_curve

    requests = held(generate("mix", seed, num_requests), "--requests")
    prompt_tokens = sum(len(r.tokens) for r in requests)
    pages = prompt_tokens // page_size
    capacities = sorted({max(1, pages // d) for d in (400, 150, 60, 25, 10)})
    click.echo(f"trace: mix, {len(requests):,} requests, {prompt_tokens:,} prompt tokens, seed {seed}")
    rows = []
    runs = [(p, c) for p in policies.available() for c in capacities]
    with progress(len(runs) * len(requests), quiet, "demo") as bar:
        for policy, capacity in runs:
            cache = PrefixCache(num_blocks=capacity, page_size=page_size, policy=policy)
            result = replay(requests, cache, on_request=lambda r, h: bar.update(), miss_reasons=False)
            rows.append({"trace": f"mix(seed={seed})", **result.as_dict()})
    show(sweep_table_rows(rows, DEFAULT_MODEL), SWEEP_COLUMNS, formats(fmt, None, as_json)[0], columns)
    curve = trace_curve(requests, page_size, capacities)
    lru = [row["hit_tokens"] for row in rows if row["policy"] == "lru"]
    click.echo(f"one-pass LRU curve equals the LRU replays at {len(capacities)} capacities: {curve.hit_tokens == lru}")
    os.makedirs(out_dir, exist_ok=True)
    write_jsonl(rows, os.path.join(out_dir, "demo.jsonl"))
    try:
        from .analysis.plot import choose_policies, plot_results

        title = (f"generated mix workload (seed {seed}), {len(requests):,} requests \u00b7 page {page_size} "
                 f"\u00b7 {DEFAULT_MODEL}")
        shown = choose_policies(rows, DEMO_FIGURE_POLICIES)
        png = plot_results(rows, os.path.join(out_dir, "demo.png"), title=title,
                           ceiling=curve.max_hit_tokens / max(curve.prompt_tokens, 1), policies=shown)
        click.echo(f"figure: {', '.join(shown)} (by mean hit rate; all "
                   f"{len({row['policy'] for row in rows})} in the table)")
        click.echo(f"wrote {os.path.join(out_dir, 'demo.jsonl')} and {png}")
    except RuntimeError as exc:  # matplotlib missing: the table is the demo
        click.echo(f"wrote {os.path.join(out_dir, 'demo.jsonl')}; no plot: {exc}")


SWEEP_COLUMNS = REPLAY_COLUMNS
DEMO_FIGURE_POLICIES = 7
"""Policies the demo figure draws at most (chosen by result: :func:`~radixkv.analysis.plot.choose_policies`)."""


def sweep_table_rows(rows: list, model: Optional[str]) -> list:
    """Sweep rows with the table's derived columns (capacity in tokens and GiB, prefill PFLOPs saved)."""
    return [{**with_capacity(row, model), "prefill_pflops_saved": row["prefill_flops_saved"] / 1e15} for row in rows]


def named(option: str, parse: Callable, text: str):
    """``parse(text)``, its ValueError prefixed with the option's name."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ArgumentValueError(f"{option}: {exc}") from None


def write_jsonl(rows: list, path: str) -> None:
    """``rows`` as JSON lines replacing ``path`` (:func:`~radixkv.workload.tracefiles.replacing`). O(rows)."""
    with replacing(path) as f:
        for row in rows:
            f.write(to_json(row) + "\n")


CAPACITIES_HELP = ("Comma-separated capacities: blocks (1000, 10k), tokens (3Mtok), KV bytes of --model (40GiB) "
                   f"or shares of the trace's distinct pages (1%,5%,25%,100%); each at most {CAPACITY_BOUND}.")


def cli_capacities(text: str, trace, page_size: int, model: Optional[str]) -> list:
    """``--capacities`` as blocks; a share reads the trace once for its distinct pages."""
    from .capacity import parse_capacities
    from .analysis.sweep import distinct_pages

    pages = functools.lru_cache(maxsize=None)(
        lambda: distinct_pages(trace, page_size, mooncake=trace.format == "mooncake"))
    caps = named("--capacities", lambda t: parse_capacities(t, page_size=page_size, model=model or DEFAULT_MODEL,
                                                            distinct_pages=pages), text)
    items = [item.strip() for item in text.split(",") if item.strip()]  # parse_capacities' items, in order
    return [capped("--capacities", item, blocks) for item, blocks in zip(items, caps)]


@main.command("sweep")
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--policies", "policy_list", default="lru", show_default=True,
              help=f"Comma-separated eviction policies, e.g. lru,lfu,s3fifo,belady; of "
                   f"{', '.join(policies.available())}; or module:Class.")
@click.option("--capacities", default="auto", show_default=True,
              help=CAPACITIES_HELP + " auto: 1%,2%,5%,10%,25%,50%,100% of the distinct pages.")
@warmup_option
@interval_option
@policy_param_option
@click.option("--jobs", default=None, type=int, callback=bounded(MAX_JOBS),
              help=f"Parallel worker processes, each replaying whole runs (default: the CPUs this process may "
                   f"use, {available_cpus()} here; at most {spell(MAX_JOBS)}).")
@page_size_option
@output_options
@limit_option("Replay")
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write one JSON line per (policy, capacity) to this file.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@tokenizer_option
@sharegpt_options
@cost_options
@user_errors
def sweep_cmd(trace, policy_list, capacities, warmup, interval, policy_params, jobs, page_size, fmt, trace_fmt,
              as_json, columns, limit, skip_bad, output, quiet, tokenizer_path, model, hardware, miss_reasons) -> None:
    """Replay TRACE once per (policy, capacity) pair, in parallel with --jobs, and print a table
    (and --output JSONL, one line per pair)."""
    from .analysis.sweep import AUTO_CAPACITIES, SweepJob, parse_policies, run_sweep, sweep_cost

    out_fmt, trace_fmt = formats(fmt, trace_fmt, as_json)
    names = named("--policies", parse_policies, policy_list)
    reader = cli_trace(trace, trace_fmt, limit, skip_bad, tokenizer_path)  # a missing file fails before any work
    auto = capacities.strip() == "auto"
    caps = cli_capacities(AUTO_CAPACITIES if auto else capacities, reader, page_size, model)
    warmup = cli_warmup(warmup, reader)
    params = policy_specs(names, policy_params)
    if len(set(caps)) < len(caps):  # auto on a small trace: shares that round to the same blocks
        caps = sorted(set(caps)) if auto else caps
    jobs_list = [SweepJob(reader.path, p, c, page_size=page_size, format=trace_fmt, limit=limit, skip_bad=skip_bad,
                          model=model, hardware=hardware, miss_reasons=miss_reasons, tokenizer=tokenizer_path,
                          warmup=warmup, interval=interval or 0, policy_params=params.get(p, ()),
                          **sharegpt_shape())
                 for p in names for c in caps]
    # The bar counts LRU-replay equivalents, so a Belady run moves it as far as it takes time.
    with progress(round(sweep_cost(jobs_list), 1), quiet, "sweep", unit="LRU run") as bar:
        rows = run_sweep(jobs_list, jobs or available_cpus(), on_done=lambda row, cost: bar.update(cost))
    counted(rows[0]["requests"] if rows else 0, warmup)
    if trace == "-":
        rows = [{**row, "trace": "-"} for row in rows]
    if output:
        write_jsonl(rows, output_file("--output", output))
    show(rows if out_fmt == "json" else sweep_table_rows(rows, model), SWEEP_COLUMNS, out_fmt, columns)
    from_curve = sum(row.get("source") == "curve" for row in rows)
    if from_curve and out_fmt == "table":
        click.echo(f"\nlru: {from_curve} capacities from one pass of the LRU curve (the numbers of a replay at "
                   "each; `radixkv curve`)")
    if rows and rows[0]["skipped_lines"] and out_fmt != "json":
        click.echo(f"skipped {rows[0]['skipped_lines']} malformed lines", err=True)


@main.command("curve")
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@page_size_option
@click.option("--capacities", default="auto", show_default=True,
              help=CAPACITIES_HELP + " auto: about 50 log-spaced capacities from 1 block to the trace's "
                                     "distinct pages.")
@output_options
@limit_option("Use")
@warmup_option
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--model", default=DEFAULT_MODEL, show_default=True, type=click.Choice(sorted(MODELS)),
              help="Model whose KV bytes size the GiB column.")
@tokenizer_option
@sharegpt_options
@user_errors
def curve_cmd(trace, page_size, capacities, fmt, trace_fmt, as_json, columns, limit, warmup, skip_bad, quiet,
              model, tokenizer_path) -> None:
    """LRU hit tokens at every capacity from ONE pass over TRACE (stack distances under the radix
    protection rule), equal to a per-capacity `radixkv replay --policy lru` at each. Without
    --capacities, a dense log-spaced grid up to the trace's distinct pages (for `radixkv plot`).

    --format json prints one object: {"capacities": [...], "hit_tokens": [...], "prompt_tokens": N, ...}."""
    from .costs import get_model
    from .analysis.sweep import trace_curve

    out_fmt, trace_fmt = formats(fmt, trace_fmt, as_json)
    get_model(model)
    reader = cli_trace(trace, trace_fmt, limit, skip_bad, tokenizer_path)
    caps = None if capacities.strip() == "auto" else cli_capacities(capacities, reader, page_size, model)
    warm = cli_warmup(warmup, reader)
    with progress(bar_total(reader, quiet), quiet, "curve") as bar:
        curve = trace_curve(reader, page_size, caps, mooncake=reader.format == "mooncake",
                            on_request=lambda r: bar.update(), warmup=warm)
    counted(curve.requests, warm)
    rows = [{"num_blocks": c, "page_size": page_size, "hit_tokens": h, "token_hit_rate": r} for c, h, r in
            zip(curve.capacities, curve.hit_tokens, curve.token_hit_rates)]
    if out_fmt != "json":
        if out_fmt == "table":
            click.echo(f"{curve.requests:,} requests, {curve.prompt_tokens:,} prompt tokens, page size {page_size}; "
                       f"no eviction at all: {curve.max_hit_tokens / max(curve.prompt_tokens, 1):.2%}")
        show([with_capacity(row, model) for row in rows], CURVE_COLUMNS, out_fmt, columns)
        if reader.skipped:
            click.echo(f"skipped {reader.skipped} malformed lines", err=True)
    else:
        click.echo(to_json({"capacities": curve.capacities, "hit_tokens": curve.hit_tokens,
                               "prompt_tokens": curve.prompt_tokens, "requests": curve.requests,
                               "page_size": page_size, "token_hit_rates": curve.token_hit_rates,
                               "warmup_requests": warm,
                               "trace": trace, "skipped_lines": reader.skipped, "model": model,
                               "no_eviction_hit_rate": curve.max_hit_tokens / max(curve.prompt_tokens, 1)}))


CURVE_COLUMNS = ["num_blocks", "capacity_tokens", "capacity_gib", "hit_tokens", "token_hit_rate"]


@main.command("plot")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", default="curve.png", show_default=True, type=click.Path(dir_okay=False),
              help="Figure to write: PNG (300 dpi), or vector PDF or SVG, by the extension.")
@click.option("--title", default="", help="Figure title.")
@click.option("--policies", "policy_list", default=None, metavar="A,B,...",
              help="Draw only these policies (lru keeps a curve's 'lru (curve)' too).")
@click.option("--over-time", is_flag=True,
              help="Draw the hit rate over time of results run with --interval: a panel per capacity.")
@user_errors
def plot_cmd(results, output, title, policy_list, over_time) -> None:
    """Plot RESULTS... (JSONL of `radixkv sweep -o`, `radixkv curve --json` output; several files
    share one x axis, a column of panels per trace): token hit rate against capacity, one fixed
    style per policy, Belady dashed as the ceiling, and below it the share of the LRU-to-Belady
    gap each policy closes (or its miss-ratio reduction over LRU without Belady)."""
    from .analysis.plot import plot_over_time, plot_results, read_results

    rows = []
    for path in results:
        with naming("RESULTS", path):
            rows += read_results(path)
    wanted = None if policy_list is None else policy_list.split(",")
    try:
        draw = plot_over_time if over_time else plot_results
        draw(rows, output_file("--output", output), title=title, policies=wanted)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {output}")


@main.command("analyze")
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@page_size_option
@output_options
@limit_option("Analyze")
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Also draw the distributions (PNG, PDF or SVG by the extension).")
@tokenizer_option
@sharegpt_options
@user_errors
def analyze_cmd(trace, page_size, fmt, trace_fmt, as_json, columns, limit, skip_bad, plot_path, tokenizer_path) -> None:
    """Describe TRACE before any cache: prompt and output lengths, the reuse distance of every page
    (the LRU stack distance: a re-use at distance d hits in an LRU cache of more than d pages), page
    popularity with a Zipf fit, the prefix each request shares with earlier ones, and the request
    rate. --json prints one object."""
    from .analysis.profile import plot_profile, profile, profile_rows

    out_fmt, trace_fmt = formats(fmt, trace_fmt, as_json)
    reader = cli_trace(trace, trace_fmt, limit, skip_bad, tokenizer_path)
    result = profile(reader, page_size, mooncake=reader.format == "mooncake")
    if out_fmt == "json":
        click.echo(to_json({"trace": trace, **result.as_dict(), "skipped_lines": reader.skipped}))
    else:
        show(profile_rows(result), ["metric", "value"], out_fmt, columns)
    if plot_path:
        try:
            written = plot_profile(result, f"{os.path.basename(trace)} \u00b7 page {page_size}",
                                   output_file("--plot", plot_path))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"wrote {written}", err=out_fmt == "json")
    if reader.skipped and out_fmt != "json":
        click.echo(f"skipped {reader.skipped} malformed lines", err=True)


@main.command("convert")
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--to", "to", required=True, type=click.Choice(["mooncake", "tokens"]),
              help="mooncake: hash_ids of 512-token blocks (replayable on a real engine's Mooncake loader); "
                   "tokens: token JSONL.")
@click.option("-o", "--output", default="-", show_default=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="File to write ('-': stdout).")
@click.option("--trace-format", "trace_fmt", type=click.Choice(TRACE_FORMATS), default=None,
              help="Trace format (default: detect).")
@limit_option("Convert")
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@tokenizer_option
@sharegpt_options
@user_errors
def convert_cmd(trace, to, output, trace_fmt, limit, skip_bad, tokenizer_path) -> None:
    """Write TRACE (token, Mooncake or ShareGPT) as Mooncake JSONL or token JSONL, so the same workload
    replays on a real engine. Mooncake ids are dense, one per distinct (prefix, 512-token block):
    replayed at page size 512 the converted trace hits exactly where TRACE does."""
    from .workload.convert import convert

    reader = cli_trace(trace, trace_fmt, limit, skip_bad, tokenizer_path)
    if output == "-":  # a reader that stops early (`| head`) ends the command quietly: user_errors
        count = convert(reader, to, sys.stdout)
        sys.stdout.flush()
    else:
        count = convert(reader, to, output_file("--output", output))
        click.echo(f"wrote {count:,} requests to {output}", err=True)
    if reader.skipped:
        click.echo(f"skipped {reader.skipped} malformed lines", err=True)


@main.command("gen")
@click.argument("kind")
@click.option("--seed", default=0, show_default=True, type=int, help="Random seed (same seed, same trace).")
@click.option("--num-requests", default=1000, show_default=True, type=int, callback=bounded(MAX_REQUESTS, minimum=0),
              help=f"Requests (at most {spell(MAX_REQUESTS)}).")
@click.option("-o", "--output", default="-", show_default=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Token JSONL file to write ('-': stdout).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A generator parameter (repeatable), e.g. --param zipf_alpha=1.2; values are JSON or text.")
@user_errors
def gen_cmd(kind, seed, num_requests, output, params) -> None:
    """Write a seeded synthetic workload of KIND (system_prompt, multi_turn, rag, agent, long_doc_qa,
    scan, mix, multitenant) as token JSONL. Parameters and their meaning: `pydoc radixkv.workload.generators`."""
    from .workload.generators import generate, write_token_jsonl

    requests = generate(kind, seed, num_requests, **gen_params(params))
    if output == "-":  # a reader that stops early (`| head`) ends the command quietly: user_errors
        write_token_jsonl(requests, sys.stdout)
        sys.stdout.flush()
    else:
        count = write_token_jsonl(requests, output_file("--output", output))
        click.echo(f"wrote {count} requests to {output}", err=True)


def held(requests: Iterable[Request], what: str) -> List[Request]:
    """``requests`` as a list, for a command that holds a whole workload; an error naming ``what``
    once their prompts pass :data:`~radixkv.workload.limits.MAX_HELD_TOKENS` (before the memory
    goes). O(requests)."""
    out: List[Request] = []
    tokens = 0
    for request in requests:
        tokens += len(request.tokens)
        if tokens > MAX_HELD_TOKENS:
            raise ArgumentValueError(f"{what}: the prompts of the first {len(out) + 1:,} requests pass "
                                     f"{spell(MAX_HELD_TOKENS)} tokens, the most a command holds in memory at once")
        out.append(request)
    return out


def gen_params(params: tuple, flag: str = "--param") -> dict:
    """``--param KEY=VALUE`` options (or ``flag``'s) as keyword arguments (values JSON, else text)."""
    kwargs = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ArgumentValueError(f"{flag} must be KEY=VALUE, got {item!r}")
        try:
            kwargs[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key.strip()] = value
    return kwargs


@main.command("attack")
@click.option("--workload", default="multitenant", show_default=True, metavar="multitenant|TRACE",
              help="The generated multi-tenant workload, or a token trace with a 'tenant' field.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the generated workload.")
@click.option("--num-requests", default=1000, show_default=True, type=int,
              callback=bounded(MAX_HELD_REQUESTS, minimum=0),
              help=f"Requests of the generated workload, probes included (at most {spell(MAX_HELD_REQUESTS)}: the "
                   f"attack holds them all, and their prompts at most {spell(MAX_HELD_TOKENS)} tokens).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A multitenant generator parameter (repeatable), as for radixkv gen.")
@click.option("--sharing", default="shared", show_default=True,
              type=click.Choice(["shared", "isolated", "k-anonymous", "adaptive"]), help="Sharing rule.")
@click.option("--k", default=None, type=int, callback=bounded(MAX_TENANTS),
              help=f"k of k-anonymous and adaptive, a count of tenants (default 3, at most {spell(MAX_TENANTS)}).")
@click.option("--budget", default=None, type=int, callback=bounded(MAX_REQUESTS, minimum=0),
              help="Requests adaptive serves beyond k-anonymity before it isolates a tenant (default 2, at most "
                   f"{spell(MAX_REQUESTS)}).")
@click.option("--attacker", default="attacker", show_default=True, help="The attacker's tenant name.")
@page_size_option
@click.option("--num-blocks", default=None, type=int, callback=bounded(MAX_CAPACITY_BLOCKS),
              help=f"HBM capacity in blocks (default: the whole trace, nothing evicted; at most {CAPACITY_BOUND}).")
@click.option("--json", "as_json", is_flag=True, help="Only the JSON line.")
@click.option("--quiet", is_flag=True, help="Same as --json: only the JSON line.")
@sharegpt_options
@user_errors
def attack_cmd(workload, seed, num_requests, params, sharing, k, budget, attacker, page_size, num_blocks, as_json,
               quiet) -> None:
    """Replay a multi-tenant workload under a sharing rule and measure the prefix-cache timing attack:
    pages of other tenants' private prefixes the attacker confirms through hits, and the hit tokens
    honest tenants keep. The last line is JSON. See `pydoc radixkv.analysis.attack`."""
    from .analysis.attack import attack
    from .workload.generators import generate

    options = {name: value for name, value in (("k", k), ("budget", budget)) if value is not None}
    if sharing in ("shared", "isolated") and options:
        raise ArgumentValueError(f"--sharing {sharing} takes no --{next(iter(options))}")
    if workload == "multitenant":
        requests = held(generate("multitenant", seed, num_requests, page_size=page_size, **gen_params(params)),
                        "the workload (--num-requests, --param)")
        source = f"multitenant(seed={seed})"
    else:
        if params:
            raise ArgumentValueError("--param applies to the generated workload, not to a trace file")
        with naming("--workload", workload):
            requests, source = held(open_trace(workload, **sharegpt_shape()), workload), workload
    result = attack(requests, sharing=sharing, page_size=page_size, num_blocks=num_blocks, attacker=attacker,
                    **options).as_dict()
    if not (as_json or quiet):
        kept = result["honest_hit_tokens"] / max(result["honest_prompt_tokens"], 1)
        precision = "-" if result["precision"] is None else f"{result['precision']:.2f}"
        click.echo(f"{source}, sharing {sharing}" + (f" (k={result['k']})" if result["k"] else ""))
        click.echo(f"attacker: {result['probes']} probes ({result['skipped_probes']} skipped), recovered "
                   f"{result['recovered_private_pages']} of {result['private_pages']} private pages, "
                   f"precision {precision}")
        click.echo(f"honest: {result['honest_requests']} requests, {result['honest_hit_tokens']:,} of "
                   f"{result['honest_prompt_tokens']:,} prompt tokens from the cache ({kept:.1%})")
    click.echo(json.dumps(result))


@main.command("cluster")
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--instances", default=4, show_default=True, type=int, callback=bounded(MAX_INSTANCES),
              help=f"Serving instances (at most {spell(MAX_INSTANCES)}, and {spell(MAX_CLUSTER_BLOCKS)} HBM blocks "
                   "in all).")
@capacity_options("HBM capacity per instance")
@click.option("--host-blocks", default="0", show_default=True, metavar="SIZE",
              help=f"Host-tier capacity per instance: blocks, tokens (3Mtok) or bytes (64GiB), at most "
                   f"{CAPACITY_BOUND}; 0: none.")
@click.option("--routing", default="round_robin", show_default=True,
              type=click.Choice(["round_robin", "least_loaded", "cache_aware", "kv_events"]),
              help="Request routing (kv_events: cache-aware from the instances' published KV events alone).")
@click.option("--event-faults", default=None, metavar="SPEC",
              help="With --routing kv_events, faults of the event streams, seeded: "
                   "drop=R,duplicate=R,reorder=R[,seed=N] (rates per batch in [0, 1)).")
@click.option("--event-lag", default=0, show_default=True, type=int, callback=bounded(MAX_EVENT_LAG, minimum=0),
              metavar="N",
              help=f"With --routing kv_events, routing decisions each batch of events takes to reach the router: "
                   f"request i is routed knowing the events of the requests before i - N (at most "
                   f"{spell(MAX_EVENT_LAG)}).")
@click.option("--borrowing/--no-borrowing", default=False, show_default=True,
              help="Lend spare HBM between instances (Infinite-LLM).")
@click.option("--lend-cap", default=0.5, show_default=True, type=click.FloatRange(0, 1),
              help="Share of its blocks an instance may lend.")
@click.option("--low-watermark", default=0.05, show_default=True, type=click.FloatRange(0, 1),
              help="Share of its blocks a creditor keeps free.")
@click.option("--lending", default="free", show_default=True, type=click.Choice(["free", "value"]),
              help="Lend free blocks only, or also the slots of pages colder than the debtor's (LRU).")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="A shared page store read past the cache's own pages and written through at each release: "
                   "memory (in-process), memory://NAME, redis://HOST:PORT[/DB] (a server or a cluster), "
                   "mooncake://HOST:PORT[?metadata=URL], or mooncake (a Mooncake master started for the run).")
@click.option("--store-blocks", default=None, type=int, callback=bounded(MAX_CAPACITY_BLOCKS),
              help=f"Pages the --store holds at most, least recently used evicted exactly (in-process, or kept "
                   f"by a single Redis server: pydoc radixkv.store.redis_lru); with --processes and --store "
                   f"mooncake, about that many (the segment of the master it starts); at most {CAPACITY_BOUND}.")
@click.option("--global-index/--no-global-index", default=False, show_default=True,
              help="Index every instance's HBM pages cluster-wide: a request pulls the pages past its own hit "
                   "from the peer that holds them (hits charged a network transfer).")
@click.option("--processes", default=None, type=int, callback=bounded(MAX_JOBS),
              help=f"Run each instance in an OS process of its own (N of them: --instances defaults to N), "
                   f"sharing --store redis://HOST:PORT (or mooncake), or a redis-server started for the run on a "
                   f"free loopback port; routed round robin, or with --routing kv_events by a router fed by each "
                   f"process's KV events over ZMQ on loopback; every hit page's bytes checked (at most "
                   f"{spell(MAX_JOBS)}).")
@click.option("--policy", default="lru", show_default=True, callback=policy_name, help=POLICY_HELP)
@policy_param_option
@warmup_option
@page_size_option
@output_options
@limit_option("Replay")
@click.option("--skip-bad", is_flag=True, help="Skip and count malformed lines instead of stopping.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@records_option
@tokenizer_option
@sharegpt_options
@cost_options
@user_errors
def cluster_cmd(trace, instances, num_blocks, max_total_tokens, kv_cache_memory, host_blocks, routing, event_faults,
                event_lag, borrowing,
                lend_cap, low_watermark, lending, store_url, store_blocks, global_index, processes, policy,
                policy_params, warmup, page_size,
                fmt, trace_fmt, as_json, columns, limit, skip_bad, quiet, records, tokenizer_path, model, hardware,
                miss_reasons) -> None:
    """Replay TRACE across a cluster of caches with request routing and (optionally) memory lending.

    Like `radixkv replay`: misses by reason (each about the instance that served the request),
    prefill saved for --model on --hardware, and --records (each record adds its `instance`).
    With --processes the instances are real processes over a shared Redis store (`pydoc radixkv.fleet`);
    with --routing kv_events as well, each publishes its KV events over ZMQ and the router subscribes."""
    from .cluster import Cluster, routes_ahead

    if processes is not None:
        instances = fleet_flags(processes, instances, routing, borrowing, global_index, policy, store_url,
                                store_blocks)
    if policies.create(policy).offline and not routes_ahead(routing, instances):
        raise ArgumentValueError(f"--policy {policy} needs each instance's future requests, which --routing {routing} "
                                 f"decides from cache state as it goes: use --routing round_robin or --instances 1")
    faults = event_faults_flag(event_faults, routing)
    if event_lag and (routing != "kv_events" or processes is not None):
        raise ArgumentValueError(f"--event-lag delays the KV events of the simulator's --routing kv_events; got "
                                 + (f"--routing {routing}" if routing != "kv_events" else "--processes"))
    params = policy_specs([policy], policy_params).get(policy, ())
    policy_arg = policies.PolicySpec(policy, params) if params else policy
    out_fmt, trace_fmt = formats(fmt, trace_fmt, as_json)
    num_blocks = cli_blocks(num_blocks, max_total_tokens, kv_cache_memory, page_size, model)
    host_blocks = tier_blocks("--host-blocks", host_blocks, page_size, model)
    if instances * num_blocks > MAX_CLUSTER_BLOCKS:
        raise ArgumentValueError(f"--instances {instances} x {num_blocks:,} blocks each is {instances * num_blocks:,} "
                                 f"HBM blocks; a cluster may have at most {spell(MAX_CLUSTER_BLOCKS)} in all")
    if processes is None:
        cluster = Cluster(instances, num_blocks, page_size, policy_arg, host_blocks=host_blocks, borrowing=borrowing,
                          routing=routing, lend_cap=lend_cap, low_watermark=low_watermark, lending=lending,
                          global_index=global_index, event_faults=faults, event_lag=event_lag,
                          **cluster_store(store_url, store_blocks))
    reader = cli_trace(trace, trace_fmt, limit, skip_bad, tokenizer_path)
    warmup = cli_warmup(warmup, reader)
    if warmup and processes is not None:
        raise ArgumentValueError("--warmup is not supported with --processes (their counts are kept in each "
                                 "process from the start)")
    with records_writer(records) as write, progress(bar_total(reader, quiet), quiet, "cluster") as bar:
        serving = dict(on_request=lambda r, h: bar.update(), model=model, hardware=hardware,
                       on_record=(lambda rec, i: write(rec, instance=i)) if write else None)
        if processes is None:
            result = cluster.replay(reader, miss_reasons=miss_reasons, warmup=warmup, **serving)
            fleet = {}
        else:
            from .fleet import replay_fleet

            outcome = replay_fleet(reader, processes, num_blocks, page_size, policy_arg, host_blocks=host_blocks,
                                   store=store_url, store_blocks=store_blocks, miss_reasons=miss_reasons,
                                   routing=routing, event_faults=faults, **serving)
            result, fleet = outcome.cluster, outcome.as_dict()
    counted(result.requests, warmup)
    out = {**result.as_dict(), **fleet, "skipped_lines": reader.skipped}
    if params:
        out["policy_params"] = dict(params)
    row = out if out_fmt == "json" else with_capacity({**out, "page_size": page_size}, model)
    show([row], CLUSTER_COLUMNS, out_fmt, columns)
    if out_fmt == "table" and not columns:
        warm = f" (after a warm-up of {result.warmup_requests:,})" if result.warmup_requests else ""
        click.echo(f"\n{result.requests:,} requests{warm}, {result.prompt_tokens:,} prompt tokens\n"
                   f"capacity per instance: {capacity_line(num_blocks, page_size, model)}")
        if fleet:
            click.echo(f"processes: {processes}, one instance each; {fleet['verified_pages']:,} hit pages checked "
                       f"byte for byte, {fleet['wrong_pages']:,} wrong")
        if store_url is not None or fleet:
            st = result.store_stats
            click.echo(f"shared store: {result.store_hit_tokens:,} tokens served, {st.get('pages_written', 0):,} "
                       f"pages written, {st.get('round_trips', 0):,} round trips,\n"
                       f"  {st.get('integrity_misses', 0):,} integrity misses, {st.get('backend_errors', 0):,} errors")
        if routing == "kv_events":
            st = result.router_stats
            click.echo(f"router: {result.router_false_hit_pages:,} false-hit pages, {result.router_missed_pages:,} "
                       f"missed, {result.router_divergent_pages:,} pages off the instances' HBM at the end,\n"
                       f"  {result.router_us_per_request:,.0f} us a request"
                       + (" (with the wait to hear each batch over ZMQ)" if fleet else "")
                       + (f", each batch heard {result.event_lag:,} decisions late" if result.event_lag else "")
                       + f"\nevent streams: {st['batches_dropped']:,} batches dropped, {st['duplicates']:,} "
                       f"repeats skipped, {st['gaps']:,} gaps, {st['batches_replays']:,} replays, "
                       f"{st['lost']:,} lost" + (f", {st['late']:,} fetched late" if "late" in st else ""))
        if borrowing:
            click.echo(f"lending: {result.blocks_lent:,} blocks lent ({result.bytes_lent / 2**30:,.2f} GiB), "
                       f"{result.blocks_recalled:,} recalled, {result.blocks_moved:,} moved, {result.refusals:,} "
                       f"refused\nborrowed memory: {result.borrowed_hit_tokens:,} hit tokens, "
                       f"{figure(result.borrowed_transfer_seconds)} s of transfer")
        if global_index:
            click.echo(f"pulled from peers: {result.peer_hit_tokens:,} tokens ({result.pages_pulled:,} pages), "
                       f"{figure(result.peer_transfer_seconds)} s of transfer\n"
                       f"cluster-wide index: {result.index_pages:,} pages, {result.index_us_per_request:,.0f} us "
                       f"a request")
        show_savings(out, out_fmt)
    if reader.skipped and out_fmt != "json":
        click.echo(f"skipped {reader.skipped} malformed lines", err=True)


def fleet_flags(processes: int, instances: int, routing: str, borrowing: bool, global_index: bool, policy: str,
                store_url: Optional[str], store_blocks: Optional[int]) -> int:
    """The instances of ``cluster --processes N`` (N, or --instances when given and equal), once the flags it
    cannot honour are refused, one line each, naming them."""
    import shutil

    given = click.get_current_context().get_parameter_source("instances") is not click.core.ParameterSource.DEFAULT
    if given and instances != processes:
        raise ArgumentValueError(f"--processes {processes} runs one instance a process: --instances {instances} "
                                 f"differs (leave it out, or give {processes})")
    for refused, flag in ((routing not in ("round_robin", "kv_events"), f"--routing {routing}"),
                          (borrowing, "--borrowing"), (global_index, "--global-index"),
                          (policies.create(policy).offline, f"--policy {policy}")):
        if refused:
            raise ArgumentValueError(f"--processes routes round robin or by KV events over caches that share only "
                                     f"the store; {flag} is not supported there")
    shared = store_url in (None, "redis", "mooncake") or store_url.startswith(("redis://", "rediss://", "mooncake://"))
    if not shared:
        raise ArgumentValueError(f"--processes needs a store the processes share: --store redis://HOST:PORT or "
                                 f"mooncake://HOST:PORT, --store mooncake (a Mooncake master started for the run), "
                                 f"or no --store (a redis-server started for the run); got --store {store_url}")
    from .fleet.coordinator import check_store

    try:
        check_store(store_url, store_blocks)
    except ArgumentValueError as exc:
        raise ArgumentValueError(f"--store-blocks: {exc}") from None
    if store_url in (None, "redis") and shutil.which("redis-server") is None:
        raise ArgumentValueError("--processes needs a redis-server on PATH (apt-get install redis-server) or "
                                 "--store redis://HOST:PORT")
    return processes


def event_faults_flag(spec: Optional[str], routing: str):
    """``--event-faults`` parsed (``None`` when not given), refused without ``--routing kv_events``."""
    if spec is None:
        return None
    if routing != "kv_events":
        raise ArgumentValueError(f"--event-faults injects faults into the KV event streams of --routing kv_events; "
                                 f"got --routing {routing}")
    from .router.link import EventFaults

    return EventFaults.parse(spec)


def cluster_store(url: Optional[str], store_blocks: Optional[int]) -> dict:
    """``Cluster``'s store arguments from ``--store`` / ``--store-blocks``, checked as the flags name them."""
    if url is None and store_blocks is None:
        return {}
    store_for(url, store_blocks, 1)  # the flags' checks; the cluster opens one per instance
    return {"store": url, "store_blocks": store_blocks}


CLUSTER_COLUMNS = ["routing", "borrowing", "instances", "num_blocks", "capacity_tokens", "hit_tokens",
                   "token_hit_rate", "bytes_lent"]


def result_row(result: ReplayResult) -> dict:
    return result.as_dict()


if __name__ == "__main__":  # pragma: no cover
    main()
