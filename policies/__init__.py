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

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple, Type, Union

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
    """The class registered as ``name`` or as an alias, or a user's class given as ``"module:Class"``
    (:func:`load`); :class:`UnknownPolicyError` lists the names."""
    if isinstance(name, str) and ":" in name:
        return load(name)
    cls = _REGISTRY.get(_ALIASES.get(name, name)) if isinstance(name, str) else None
    if cls is None:
        raise UnknownPolicyError(
            f"unknown policy {name!r}; available: {', '.join(available(include_aliases=True))}")
    return cls


def load(spec: str) -> Type[EvictionPolicy]:
    """The :class:`EvictionPolicy` subclass ``spec`` names as ``"module:Class"`` (``"mypolicies:MRU"``,
    ``"pkg.mod:Cls"``), imported as Python imports it, the current directory first when it is not on
    ``sys.path`` already (as ``python -m`` has it), so a policy in a file beside the trace loads.
    Cost: one import.

    Raises:
        UnknownPolicyError: the module cannot be imported or has no such attribute.
        ArgumentTypeError: the attribute is not an :class:`EvictionPolicy` subclass.
    """
    import importlib
    import os
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UnknownPolicyError(f"a policy class is 'module:Class', got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownPolicyError(f"policy {spec!r}: cannot import {module_name!r} ({exc})") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise UnknownPolicyError(f"policy {spec!r}: module {module_name!r} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
        raise ArgumentTypeError(f"policy {spec!r} must be an EvictionPolicy subclass, got {cls!r}")
    return cls


def parameters(policy: str) -> List[str]:
    """Names of the keyword arguments the constructor of ``policy`` takes. Raises as :func:`resolve`."""
    import inspect

    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(resolve(policy)).parameters.values() if p.kind in kinds]


@dataclass(frozen=True)
class PolicySpec:
    """A policy to build: a registered name or ``"module:Class"``, and constructor arguments.

    Picklable and passed where a name goes (:func:`create` builds it), so every cache, tier and
    sweep worker builds its own instance: ``PolicySpec("s3fifo", (("small_fraction", 0.2),))``
    is libCacheSim's ``-e small_fraction=0.2``.
    """

    policy: str
    params: Tuple[Tuple[str, Any], ...] = ()

    def create(self) -> EvictionPolicy:
        """A new instance. Raises as :meth:`check`."""
        return create(self.policy, **dict(self.params))

    def check(self) -> EvictionPolicy:
        """Build one instance to validate the arguments against the constructor, naming what is wrong.

        Raises:
            UnknownPolicyError: an unknown policy.
            ArgumentValueError: a parameter the constructor does not take (the message lists those
                it does), or a value it refuses (its own message).
        """
        takes = parameters(self.policy)
        for key, _ in self.params:
            if key not in takes:
                raise ArgumentValueError(f"policy {self.policy} takes no parameter {key!r}; it takes "
                                         f"{', '.join(takes) or 'none'}")
        try:
            return self.create()
        except (TypeError, ValueError) as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in self.params)
            raise ArgumentValueError(f"policy {self.policy}({shown}): {exc}") from None


def create(policy: Union[str, EvictionPolicy, PolicySpec], **options: object) -> EvictionPolicy:
    """An instance of the policy named ``policy`` (a registered name or ``"module:Class"``), or
    built from a :class:`PolicySpec`; an instance passes through."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if isinstance(policy, PolicySpec):
        return resolve(policy.policy)(**{**dict(policy.params), **options})
    if not isinstance(policy, str):
        raise ArgumentTypeError(f"policy must be a name or an EvictionPolicy, got {policy!r}")
    return resolve(policy)(**options)


__all__ = ["EvictionPolicy", "Offline", "RequestHints", "LRU", "FIFO", "LFU", "SLRU", "SIEVE", "S3FIFO", "GDSF", "AdaptiveRetention", "TwoQ", "ARC", "LIRS", "WorkloadAware", "HitDensity", "Belady",
           "PolicySpec", "available", "create", "load", "parameters", "register", "resolve"]
