"""Eviction policies, found by name.

>>> from radixkv.policies import available, create
>>> "lru" in available()
True

Adding a policy: write a module with an :class:`EvictionPolicy` subclass and
add it to ``_REGISTRY`` below.
"""

from __future__ import annotations

from typing import Dict, List, Type, Union

from radixkv.errors import UnknownPolicyError

from .base import EvictionPolicy
from .lru import LRU

_REGISTRY: Dict[str, Type[EvictionPolicy]] = {cls.name: cls for cls in (LRU,)}


def available() -> List[str]:
    """Names of every registered policy, sorted."""
    return sorted(_REGISTRY)


def register(cls: Type[EvictionPolicy]) -> Type[EvictionPolicy]:
    """Register ``cls`` under ``cls.name`` (usable as a class decorator)."""
    if not cls.name:
        raise ValueError(f"policy class {cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def create(policy: Union[str, EvictionPolicy], **options: object) -> EvictionPolicy:
    """An instance of the policy named ``policy`` (an instance passes through)."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a name or an EvictionPolicy, got {policy!r}")
    try:
        cls = _REGISTRY[policy]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown policy {policy!r}; available: {', '.join(available())}"
        ) from None
    return cls(**options)


__all__ = ["EvictionPolicy", "LRU", "available", "create", "register"]
