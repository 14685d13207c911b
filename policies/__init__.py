"""Eviction policies, found by name.

>>> from radixkv.policies import available, create
>>> "lru" in available()
True

Adding a policy: write a module with an :class:`EvictionPolicy` subclass (plus
:class:`Offline` if it needs the future) and add it to ``_CLASSES`` below (or
call :func:`register`).

=========  ===================================================================
name       rule
=========  ===================================================================
lru        least recently used
fifo       first cached, first evicted
lfu        LFU with dynamic aging (alias ``lfu-da``)
slru       never-reused leaves first, LRU within each segment
sieve      FIFO whose hand spares leaves used since it last passed
s3fifo     small probationary FIFO + main FIFO with reinsertion + ghost
gdsf       Greedy-Dual-Size-Frequency on prefill restore cost (alias ``cost``)
adaptive   per-class retention windows learned from observed reuse gaps
2q         reused pages (ghost-remembered too) outrank first uses for a learned window
arc        ARC: LRU lists of pages used once / again, split by ghost hits
lirs       largest max(last reuse interval, age) first, with a ghost
wa         ATC'25 workload-aware: lowest exponential-fit reuse probability per class first
density    lowest predicted hit density (Kaplan-Meier per class) first
belady     offline optimum with bypass (needs the future; replay provides it)
=========  ===================================================================
"""

from __future__ import annotations

from typing import Dict, List, Type, Union

from radixkv.errors import ArgumentTypeError, ArgumentValueError, UnknownPolicyError

from .adaptive import AdaptiveRetention
from .arc import ARC
from .base import EvictionPolicy, Offline, RequestHints
from .belady import Belady
from .density import HitDensity
from .fifo import FIFO
from .gdsf import GDSF
from .lfu import LFU
from .lirs import LIRS
from .lru import LRU
from .s3fifo import S3FIFO
from .sieve import SIEVE
from .slru import SLRU
from .twoq import TwoQ
from .wa import WorkloadAware

_CLASSES = (LRU, FIFO, LFU, SLRU, SIEVE, S3FIFO, GDSF, AdaptiveRetention, TwoQ, ARC, LIRS, WorkloadAware, HitDensity, Belady)
_REGISTRY: Dict[str, Type[EvictionPolicy]] = {}
_ALIASES: Dict[str, str] = {}


def available(*, include_aliases: bool = False) -> List[str]:
    """Names of every registered policy, sorted (aliases too when asked)."""
    return sorted({**_REGISTRY, **_ALIASES} if include_aliases else _REGISTRY)


def register(cls: Type[EvictionPolicy]) -> Type[EvictionPolicy]:
    """Register ``cls`` under ``cls.name`` and its ``aliases`` (usable as a class decorator)."""
    if not cls.name:
        raise ArgumentValueError(f"policy class {cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    for alias in cls.aliases:
        _ALIASES[alias] = cls.name
    return cls


for _cls in _CLASSES:
    register(_cls)


def resolve(name: str) -> Type[EvictionPolicy]:
    """The class registered as ``name`` or as an alias; :class:`UnknownPolicyError` lists the names."""
    cls = _REGISTRY.get(_ALIASES.get(name, name)) if isinstance(name, str) else None
    if cls is None:
        raise UnknownPolicyError(
            f"unknown policy {name!r}; available: {', '.join(available(include_aliases=True))}")
    return cls


def create(policy: Union[str, EvictionPolicy], **options: object) -> EvictionPolicy:
    """An instance of the policy named ``policy`` (an instance passes through)."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if not isinstance(policy, str):
        raise ArgumentTypeError(f"policy must be a name or an EvictionPolicy, got {policy!r}")
    return resolve(policy)(**options)


__all__ = ["EvictionPolicy", "Offline", "RequestHints", "LRU", "FIFO", "LFU", "SLRU", "SIEVE", "S3FIFO", "GDSF", "AdaptiveRetention", "TwoQ", "ARC", "LIRS", "WorkloadAware", "HitDensity", "Belady",
           "available", "create", "register", "resolve"]
