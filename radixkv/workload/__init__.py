"""Workloads: where requests come from.

Trace files (Mooncake JSONL, plain token lists, ShareGPT conversations; plain, gzip, zstd or
stdin), their readers and format detection, a tokenizer for text traces, and synthetic
generators. Everything here yields :class:`~radixkv.workload.traces.Request` and knows nothing
of caches.
"""
