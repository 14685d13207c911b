"""Analysis: requests in, numbers out.

Replay of a trace through a cache (:mod:`~radixkv.analysis.replay`) with its counters and miss
reasons (:mod:`~radixkv.analysis.stats`), capacity sweeps, the one-pass LRU hit curve, tables
and plots. Reads workloads, drives the engine through its public API.
"""
