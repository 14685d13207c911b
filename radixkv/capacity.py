"""Cache sizes in the units serving engines use: blocks, tokens, bytes, or a share of a trace.

SGLang sizes its KV pool in tokens (``--max-total-tokens``), vLLM in bytes
(``--kv-cache-memory-bytes``) or blocks (``--num-gpu-blocks-override``), and
cache studies in a share of the trace's distinct pages (libCacheSim's
``0.01,0.1``). radixkv's caches count blocks (pages); this module converts:

* tokens: ``tokens // page_size`` blocks (a partial page holds nothing);
* bytes: ``bytes // kv_bytes_per_page(model, page_size)`` (:mod:`radixkv.costs`);
* ``"25%"``: that share of the trace's distinct pages, rounded down, at least 1.

Every command and the Python API go through :func:`resolve_blocks` (one size
given three ways, exactly one of them) and :func:`parse_capacity` (one item of
a capacity list). Errors name the flag or parameter the caller passes as
``name``; nothing is allocated here.
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional, Union

from .costs import DEFAULT_MODEL, ModelSpec, get_model, kv_bytes_per_page, kv_bytes_per_token
from .errors import ArgumentTypeError, ArgumentValueError
from .keys import check_positive_int, is_int
from .pool import MAX_BLOCKS

_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_COUNT = re.compile(rf"\s*{_NUMBER}\s*([kKmMgGtT]?)\s*")
_BYTES = re.compile(rf"\s*{_NUMBER}\s*([kKmMgGtT]?i?[bB]|[kKmMgGtT]?)\s*")
_ITEM = re.compile(rf"\s*{_NUMBER}\s*(%|[kKmMgGtT]?i?[bB]|[kKmMgGtT]?\s*(?:tok(?:ens?)?)?)\s*", re.IGNORECASE)

GIB = 2**30

ModelLike = Union[str, ModelSpec]


def _model(model: ModelLike) -> ModelSpec:
    return get_model(model) if isinstance(model, str) else model


def parse_count(text: object, name: str = "capacity") -> int:
    """A whole count > 0 from an int or from ``"1000"``, ``"10k"``, ``"1.5M"`` or ``"2G"`` (decimal: k = 1000)."""
    if isinstance(text, bool):
        raise ArgumentTypeError(f"{name} must be a number, got {text!r}")
    if is_int(text):
        return check_positive_int(text, name)
    match = _COUNT.fullmatch(str(text))
    if match is None:
        raise ArgumentValueError(f"{name} must be a number like 1000, 10k or 1.5M, got {text!r}")
    return _whole(float(match.group(1)) * _COUNT_SUFFIXES[match.group(2).lower()], text, name)


def parse_bytes(text: object, name: str = "size") -> int:
    """Bytes from ``"40GiB"``, ``"40GB"``, ``"40G"`` (= 40e9) or ``"1000000"``; binary units are 1024-based."""
    if is_int(text):
        return check_positive_int(text, name)
    match = _BYTES.fullmatch(str(text))
    if match is None:
        raise ArgumentValueError(f"{name} must be a size like 40GiB, 40GB or 40000000000 (bytes), got {text!r}")
    unit = match.group(2).lower()
    scale = _BYTE_UNITS.get(unit) or _BYTE_UNITS.get(unit + "b") if unit else 1
    return _whole(float(match.group(1)) * scale, text, name)


def _whole(value: float, text: object, name: str) -> int:
    """The count ``text`` spells (``value``, its number times its unit), or raise naming ``text``."""
    if value != int(value):
        raise ArgumentValueError(f"{name} must be a whole number, got {text!r} = {value:g}")
    if value <= 0:
        raise ArgumentValueError(f"{name} must be > 0, got {text!r}")
    return int(value)


def _checked(blocks: int, name: str, text: object, unit: str) -> int:
    if blocks < 1:
        raise ArgumentValueError(f"{name} {text} is less than one block ({unit})")
    if blocks > MAX_BLOCKS:
        raise ArgumentValueError(f"{name} {text} is {blocks:,} blocks, more than the {MAX_BLOCKS:,} a cache "
                                 "can index (int32 block ids)")
    return blocks


def resolve_blocks(*, num_blocks: object = None, max_total_tokens: object = None, kv_cache_memory: object = None,
                   page_size: int, model: ModelLike = DEFAULT_MODEL,
                   names: tuple = ("num_blocks", "max_total_tokens", "kv_cache_memory")) -> int:
    """Cache capacity in blocks from exactly one of three sizes.

    Args:
        num_blocks: blocks (pages); an int or text with k/M/G suffixes.
        max_total_tokens: tokens (SGLang's ``--max-total-tokens``): ``tokens // page_size`` blocks.
        kv_cache_memory: bytes of KV memory (vLLM's ``--kv-cache-memory-bytes``), an int or
            text like ``"40GiB"``: ``bytes // (kv_bytes_per_token(model) * page_size)`` blocks.
        page_size: tokens per page.
        model: preset name or :class:`~radixkv.costs.ModelSpec` for the bytes conversion.
        names: how errors call the three sizes (the CLI passes its flags).

    Raises :class:`~radixkv.errors.ArgumentValueError` naming the size when none or
    more than one is given, when it is under one block, or above
    :data:`radixkv.pool.MAX_BLOCKS`. O(1), allocates nothing.
    """
    given = [(n, v) for n, v in zip(names, (num_blocks, max_total_tokens, kv_cache_memory)) if v is not None]
    if len(given) != 1:
        listed = ", ".join(names[:-1]) + " or " + names[-1]
        raise ArgumentValueError(f"give exactly one of {listed} (cache capacity), got "
                                 f"{' and '.join(n for n, _ in given) if given else 'none'}")
    name, value = given[0]
    if num_blocks is not None:
        return _checked(parse_count(num_blocks, name), name, value, "blocks")
    if max_total_tokens is not None:
        tokens = parse_count(max_total_tokens, name)
        return _checked(tokens // page_size, name, value, f"{page_size} tokens per page")
    spec = _model(model)
    page_bytes = kv_bytes_per_page(spec, page_size)
    return _checked(parse_bytes(kv_cache_memory, name) // page_bytes, name, value,
                    f"{page_bytes:,} bytes per page of {spec.name}")


def parse_capacity(text: object, *, page_size: int = 16, model: ModelLike = DEFAULT_MODEL,
                   distinct_pages: Optional[Callable[[], int]] = None, name: str = "capacity") -> int:
    """One capacity in blocks: ``"1000"`` / ``"10k"`` blocks, ``"3Mtok"`` tokens, ``"40GiB"`` bytes
    (of ``model``'s KV) or ``"25%"`` of the trace's distinct pages (``distinct_pages()``, called
    only for a percentage). Raises ArgumentValueError naming ``name`` and the text."""
    if isinstance(text, int) and not isinstance(text, bool):
        return _checked(parse_count(text, name), name, text, "blocks")
    match = _ITEM.fullmatch(str(text))
    if match is None:
        raise ArgumentValueError(f"{name} must be blocks (1000, 10k), tokens (3Mtok), bytes (40GiB) "
                                 f"or a share of the trace's distinct pages (25%), got {text!r}")
    number, unit = match.group(1), re.sub(r"\s", "", match.group(2).lower())
    if unit == "%":
        share = float(number)
        if not 0 < share <= 100:
            raise ArgumentValueError(f"{name}: a share must be in (0%, 100%], got {text!r}")
        if distinct_pages is None:
            raise ArgumentValueError(f"{name}: {text!r} is a share of a trace's distinct pages; no trace given")
        return _checked(max(1, int(distinct_pages() * share / 100)), name, text, "pages")
    if unit.endswith("b"):
        return resolve_blocks(kv_cache_memory=str(text).strip(), page_size=page_size, model=model,
                              names=(name, name, name))
    if "tok" in unit:
        return resolve_blocks(max_total_tokens=number + unit.split("tok")[0], page_size=page_size,
                              names=(name, name, name))
    return _checked(parse_count(number + unit, name), name, text, "blocks")


def parse_capacities(text: object, **kwargs) -> List[int]:
    """Comma-separated capacities (:func:`parse_capacity`, same keyword arguments), in the order given."""
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = [item for item in str(text).split(",") if item.strip()]
    if not items:
        raise ArgumentValueError(f"{kwargs.get('name', 'capacities')} must list at least one capacity, got {text!r}")
    return [parse_capacity(item, **kwargs) for item in items]


def describe(num_blocks: int, page_size: int, model: Optional[ModelLike] = None) -> dict:
    """``{"num_blocks", "capacity_tokens"}`` and, with a model, ``"capacity_gib"`` (its KV bytes / 2**30)."""
    out: dict = {"num_blocks": num_blocks, "capacity_tokens": num_blocks * page_size}
    if model is not None:
        out["capacity_gib"] = num_blocks * page_size * kv_bytes_per_token(_model(model)) / GIB
    return out
