"""Upper bounds on the sizes and counts the ``radixkv`` commands and the workload generators take.

Why: a size is a promise of memory. A page size draws one 8-byte key multiplier per token up
front, a cluster keeps an instances x instances ledger, a demo holds its whole workload, a
generator keeps its documents and open sessions: unchecked, a mistyped ``2**40`` or ``10**20``
ran until a MemoryError traceback or the OOM killer. Each bound below is generous for real use
(what real traces and deployments use is noted) and keeps what the value allocates well inside
a 24 GiB machine. A value past a bound is an :class:`~radixkv.errors.ArgumentValueError` naming
the parameter (the CLI: one line naming the flag, exit 2), raised before anything is allocated
or written.

The bounds live here, in one place, for the CLI (:mod:`radixkv.cli`) and the generators
(:mod:`radixkv.workload.generators`, :mod:`radixkv.workload.sharegpt`) alike.
"""

from __future__ import annotations

from ..errors import ArgumentValueError

MAX_PAGE_SIZE = 2**16
"""Tokens per page. Engines use 1 (SGLang) to a few hundred (vLLM blocks of 16-128, Mooncake's
512-token hash blocks); the page keys draw 8 bytes per token of a page up front (512 KiB here)."""

MAX_CAPACITY_BLOCKS = 2**28
"""Blocks of one cache: HBM (of each cluster instance), the host tier, each remote host, each
``--capacities`` item. A tiered cache keeps 1 byte per HBM block from the start and the KV-event
publisher 8, so 2.25 GiB at the bound (at the int32 id limit, 2**31 - 1, that was 18 GiB);
2**28 blocks of 16 llama-3-8b tokens are 512 TiB of KV, more than any deployment holds."""

MAX_CLUSTER_BLOCKS = 2**30
"""HBM blocks of a whole cluster (instances x blocks each): 1 byte each from the start (1 GiB)."""

MAX_INSTANCES = 1024
"""Cluster instances: the lending ledger is instances x instances int64 (8 MiB here; 10**8
asked for 71 PiB), and routing looks at every instance for each request."""

MAX_REMOTE_HOSTS = 1024
"""Remote hosts, simulated or ``--redis`` URLs: a store and a block pool each (Mooncake-style
stores run tens to hundreds of nodes)."""

MAX_JOBS = 64
"""Sweep worker processes: each is an interpreter with numpy (~60 MiB) plus one replay's cache,
so 64 of them stay within a few GiB beyond the trace's own state."""

MAX_REQUESTS = 2**32
"""Requests a command streams (``--limit``, ``gen --num-requests``, ``attack --budget``): the
largest public traces hold tens of millions; nothing is kept per request."""

MAX_HELD_REQUESTS = 100_000
"""Requests of a generated workload a command holds in memory at once (``demo``, ``attack``):
about 1 KiB each beyond their tokens; the generated mix averages ~1,400 tokens a request."""

MAX_EVENT_LAG = 9_000
"""Routing decisions a KV event batch may take to reach the simulated router (``cluster --event-lag``):
the batches in flight are held, each with its token ids (tens of KiB a request on long prompts).
A link may have one batch in flight per decision, and its replay ring (vLLM's 10,000 batches) must
still hold a gap's batches, and the few before it a replay starts from, when they fall due."""

MAX_HELD_TOKENS = 2**28
"""Prompt tokens of a workload a command holds in memory at once (``demo``, ``attack``): an attack
peaks near 16 bytes a token (the tokens, its page index, a cache of every page), 4 GiB here."""

MAX_TENANTS = 2**16
"""Tenants of a generated workload, and ``k`` of k-anonymity (a count of tenants): the sharing
rules keep state for at most this many tenants (``radixkv.tenancy.DEFAULT_MAX_TENANTS``)."""

MAX_ITEMS = 2**20
"""Things a generator makes and keeps, counted one parameter at a time: prompts, documents,
sessions, agents, shots, turns, probe pages, conversations open at once. Each is a numpy array
(~100 bytes of header) or a Zipf weight (16 bytes); their products are bounded by
:data:`MAX_RESIDENT_TOKENS`."""

MAX_PROMPT_TOKENS = 2**24
"""Mean length of one generated prompt (the sum of its ``*_tokens`` parts; for sessions, after
the last turn), and so of each ``*_tokens`` parameter. A draw is at most 1.5x the mean, and a
prompt is written as JSON through a Python list (~50 bytes a token): 1.2 GiB at the bound.
Real contexts reach 10**6-10**7 tokens."""

MAX_RESIDENT_TOKENS = 2**30
"""Tokens a generator keeps at once (shared prompts, corpus documents, open sessions, the
attacker's dictionary), each array counted as :data:`ARRAY_TOKENS` more: 4 GiB of uint32 ids
(6 GiB at the longest draws)."""

ARRAY_TOKENS = 32
"""A numpy array's own size (~112 bytes of header and object) in 4-byte tokens, so a million
empty segments count against :data:`MAX_RESIDENT_TOKENS` too."""


def spell(bound: int) -> str:
    """A bound as the help text and errors write it: ``2**16`` for a power of two from 2**16 up,
    else ``1,024``. O(1)."""
    if bound >= 2**16 and bound & (bound - 1) == 0:
        return f"2**{bound.bit_length() - 1}"
    return f"{bound:,}"


def check_at_most(value: int, name: str, bound: int) -> int:
    """``value`` if it is at most ``bound``, else an :class:`ArgumentValueError` naming ``name``. O(1)."""
    if value > bound:
        raise ArgumentValueError(f"{name} must be at most {spell(bound)}, got {value:,}")
    return value
