"""SGLang 0.5.23's ``--radix-eviction-policy`` names as radixkv policies.

Layer: adapter configuration; builds a policy from :mod:`radixkv.policies`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from ...errors import ArgumentTypeError, ArgumentValueError, RadixKVError
from ... import policies as _policies


SGLANG_EVICTION_POLICIES: Dict[str, Optional[Tuple[str, Dict[str, Any]]]] = {
    "lru": ("lru", {}),
    "lfu": ("lfu", {"aging": False}),
    "fifo": ("fifo", {}),
    "slru": ("slru", {}),
    "mru": None,
    "filo": None,
    "priority": None,
    "tlru": None,
}
"""SGLang 0.5.23's ``--radix-eviction-policy`` names -> (radixkv policy, its options), ``None`` where
radixkv has no counterpart.

Each mapped policy ranks as SGLang's ``evict_policy.py`` strategy does:
``lru`` by last use; ``lfu`` by (uses, last use) with no aging (radixkv's own
``lfu`` is LFU-DA, reachable here as ``lfu-da``); ``fifo`` by the time the
pages were cached (a split keeps it, where SGLang's split gives the shared
upper part a new creation time); ``slru`` by (used at least
``protected_threshold`` times, last use). Uses are counted in more places
than SGLang's hits: SGLang counts one per request that inserts through a page;
radixkv counts every match and insert (a reusing request adds two, each
checkpoint of a chunked prefill one more, ``touch_prefix`` one). The adapter's
lookup after its own insert is not a use, so a page one request cached has
one use in both, and ``slru``'s default threshold 2 protects it at its first
reuse in both.
``mru``/``filo`` (newest first), ``priority`` (per-request priority) and
``tlru`` (a per-conversation token budget) have no radixkv policy and are
refused rather than replaced.
"""


def _eviction_policy(policy: Union[str, "_policies.EvictionPolicy"],
                     config: Optional[Dict[str, Any]]) -> "_policies.EvictionPolicy":
    """The radixkv policy for SGLang's ``eviction_policy`` name (or a radixkv name) and options.

    SGLang's names take precedence (:data:`SGLANG_EVICTION_POLICIES`, any
    case, as SGLang lowercases them); other names are radixkv policies.
    ``config`` (SGLang's ``eviction_policy_config``) goes to the policy's
    constructor as keyword arguments. Raises :class:`ArgumentValueError`
    naming the policy and the supported ones, or the option that does not fit.
    """
    if isinstance(policy, _policies.EvictionPolicy):
        if config:
            raise ArgumentValueError(f"eviction_policy_config applies to a policy name, not to {policy!r}")
        return policy
    if not isinstance(policy, str):
        raise ArgumentTypeError(f"eviction_policy must be a policy name or an EvictionPolicy, got {policy!r}")
    if config is not None and not isinstance(config, dict):
        raise ArgumentTypeError(f"eviction_policy_config must be a dict or None, got {config!r}")
    name = policy.lower()
    options: Dict[str, Any] = {}
    target = SGLANG_EVICTION_POLICIES.get(name)
    sglangs = name in SGLANG_EVICTION_POLICIES
    if target is None and (sglangs or name not in _policies.available(include_aliases=True)):
        why = "has no radixkv counterpart" if sglangs else "is unknown"
        raise ArgumentValueError(
            f"eviction policy {policy!r} {why}; supported SGLang policies: "
            f"{', '.join(sorted(n for n, t in SGLANG_EVICTION_POLICIES.items() if t))}; "
            f"radixkv policies: {', '.join(_policies.available(include_aliases=True))}")
    if target is not None:
        name, options = target
    try:
        return _policies.create(name, **{**options, **(config or {})})
    except TypeError as exc:
        if isinstance(exc, RadixKVError):
            raise
        raise ArgumentValueError(f"eviction_policy_config {config!r} does not fit policy {policy!r}: {exc}") from None

