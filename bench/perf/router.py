"""What KV-aware routing costs against hashing the request's pages, and the index's memory per block.

    .venv/bin/python bench/perf/router.py --out bench/results/router.jsonl

A :class:`~radixkv.router.KVIndex` holds ``--instances`` x ``--blocks`` indexed pages (random 64-bit
hashes, applied as wire-format ``BlockStored`` batches of 1,000), plus the pages of the first
``--requests`` requests of the Mooncake conversation trace on some instances:

* ``gpu``: every request's pages on two instances' GPU (the longest run the index can give: a
  lookup per page of the whole prompt, the all-on-the-best-medium path);
* ``mixed``: the first half of each request's pages on GPU and the rest on CPU on one instance,
  the whole prompt on CPU on another (the path that reads each page's medium).

For each request: ``hash`` is what any router pays to key it (vLLM's sha256 page hashes of the
prompt as :meth:`KVRouter.block_hashes` computes them), ``route`` is :meth:`KVRouter.route`
(hashing, the index's overlap, the choice). Each request is timed ``--rounds`` times, the two
calls interleaved, and its minimum of each is summed over the requests; the ratio ``route / hash`` is the issue's bound (<= 1.2).
``dict_bytes_per_block``: the dict, its keys and its interned masks (``sys.getsizeof``), and
``table_bytes_per_block``: the numpy mirror's two arrays, each over the distinct hashes indexed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from machine_facts import emit, machine  # noqa: E402

from radixkv.events import BlockStored  # noqa: E402
from radixkv.events.wire import encode_batch  # noqa: E402
from radixkv.router import KVIndex, KVRouter  # noqa: E402
from radixkv.workload.sources import open_trace  # noqa: E402

TRACE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "traces", "mooncake_conversation.jsonl")


def batch(hashes, medium="GPU"):
    return encode_batch([BlockStored(list(hashes), None, [], 16, medium=medium)], ts=0.0)


def index_bytes(index: KVIndex) -> tuple:
    """(the dict, its keys and interned masks; the numpy table's two arrays), in bytes."""
    where = index._where  # the benchmark measures the structures themselves
    table = index._table
    return (sys.getsizeof(where) + sum(map(sys.getsizeof, where)) + sys.getsizeof(index._intern)
            + sum(map(sys.getsizeof, index._intern)), 0 if table is None else table.keys.nbytes + table.masks.nbytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=1_000_000, help="random pages indexed per instance")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rng = random.Random(0)
    requests = [r.tokens for r in open_trace(TRACE, limit=args.requests)]
    facts = dict(machine(), load=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    for layout in ("gpu", "mixed"):
        index = KVIndex(window=10**9)
        names = [f"engine-{i}" for i in range(args.instances)]
        router = KVRouter(index, names, page_size=16)
        start = time.perf_counter()
        seqs = dict.fromkeys(names, 0)

        def apply(name, payload):
            index.apply(name, seqs[name], payload)
            seqs[name] += 1

        for name in names:
            for _ in range(args.blocks // 1000):
                apply(name, batch([rng.getrandbits(64) for _ in range(1000)]))
        build = time.perf_counter() - start
        hashed = [router.block_hashes(t) for t in requests]
        for hashes in hashed:
            if layout == "gpu":
                apply(names[0], batch(hashes))
                apply(names[1], batch(hashes))
            else:
                half = len(hashes) // 2
                apply(names[0], batch(hashes[:half]))
                apply(names[0], batch(hashes[half:], "CPU"))
                apply(names[1], batch(hashes, "CPU"))
        pages = sum(map(len, hashed))
        t_hash = t_route = 0.0
        for tokens in requests:  # interleaved, the minimum of each: the load of a shared machine cancels out
            hash_s = route_s = float("inf")
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                router.block_hashes(tokens)
                t1 = time.perf_counter()
                route = router.route(tokens)
                t2 = time.perf_counter()
                router.done(route.instance)
                hash_s, route_s = min(hash_s, t1 - t0), min(route_s, t2 - t1)
            t_hash += hash_s
            t_route += route_s
        index.check()
        row = dict(layout=layout, instances=args.instances, blocks_per_instance=args.blocks,
                   indexed_blocks=len(index), requests=len(requests), pages=pages,
                   hash_us_per_request=t_hash / len(requests) * 1e6, route_us_per_request=t_route / len(requests) * 1e6,
                   route_over_hash=t_route / t_hash, lookup_ns_per_page=(t_route - t_hash) / pages * 1e9,
                   dict_bytes_per_block=index_bytes(index)[0] / len(index),
                   table_bytes_per_block=index_bytes(index)[1] / len(index), build_seconds=build,
                   apply_ns_per_block=build / (args.instances * args.blocks) * 1e9)
        emit(dict(row, machine=facts), args.out)


if __name__ == "__main__":
    main()
