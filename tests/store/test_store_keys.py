"""Page keys: chained over the tokens, rooted in the fingerprint and the namespace, so nothing foreign ever hits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from radixkv.errors import ArgumentTypeError, ArgumentValueError, InvalidTokensError
from radixkv.events.hashing import BlockHasher
from radixkv.store import DEFAULT_PREFIX, Fingerprint, KeyChain, PageStore

from .conftest import FINGERPRINTS, FP, NAMESPACES

TOKENS = list(range(100, 124))  # 6 pages of 4


def test_a_key_is_the_prefix_and_a_sha256_chain_hash():
    chain = KeyChain(FP).chain(TOKENS)
    assert len(chain) == 6 and all(len(k) == 36 and k.startswith(DEFAULT_PREFIX) for k in chain)
    assert len(set(chain)) == 6
    other = KeyChain(FP, prefix=b"fleet-a/").chain(TOKENS)
    assert [k[8:] for k in other] == [k[4:] for k in chain]  # the prefix only names the keyspace


def test_the_chain_is_blockhashers_with_the_fingerprint_in_the_root_and_the_namespace_as_cache_salt():
    keys = KeyChain(FP)
    assert keys.hash_seed == "radixkv-store/1:" + FP.digest().hex()
    for namespace in (None, "tenant-a", ("ns", "tenant-a")):
        expected = BlockHasher("sha256_cbor", keys.hash_seed).hash_pages(TOKENS, 4, namespace=namespace)
        assert [k[4:] for k in keys.chain(TOKENS, namespace)] == expected
    pickled = KeyChain(FP, hash_fn="sha256")
    assert [k[4:] for k in pickled.chain(TOKENS)] == BlockHasher("sha256", keys.hash_seed).hash_pages(TOKENS, 4)
    assert pickled.chain(TOKENS) != keys.chain(TOKENS)


def test_equal_prefixes_share_keys_and_nothing_after_a_difference_does():
    keys = KeyChain(FP)
    full = keys.chain(TOKENS)
    assert keys.chain(TOKENS[:11]) == full[:2]  # a trailing partial page has no key
    assert keys.chain(np.asarray(TOKENS, dtype=np.int64)) == full
    forked = TOKENS[:9] + [7] + TOKENS[10:]  # page 2 differs
    fork = keys.chain(forked)
    assert fork[:2] == full[:2] and not set(fork[2:]) & set(full)
    assert keys.chain([]) == [] and keys.chain([1, 2, 3]) == []


def test_no_two_fingerprints_or_namespaces_share_a_key():
    seen = {}
    for fp, ns in itertools.product(FINGERPRINTS, NAMESPACES):
        for key in KeyChain(fp).chain(TOKENS * 2, ns):
            assert key not in seen, f"{fp}, {ns!r} shares a key with {seen[key]}"
            seen[key] = (fp, ns)
    assert len({fp.digest() for fp in FINGERPRINTS}) == len(FINGERPRINTS)


def test_same_tokens_under_another_fingerprint_or_namespace_never_hit(memory_url):
    writer = PageStore.open(memory_url, FP)
    writer.put(writer.chain(TOKENS, ("ns", "t1")), [b"x"] * 6)
    for fp, ns in itertools.product(FINGERPRINTS, NAMESPACES + [("ns", "t2"), ("ns",), "ns"]):
        reader = PageStore.open(memory_url, fp)
        chain = reader.chain(TOKENS, ns)
        assert reader.lookup(chain) == 0 and reader.get(chain) == ([], 0)
        assert reader.stats()["integrity_misses"] == 0  # not even found: other keys
    assert writer.get(writer.chain(TOKENS, ("ns", "t1")))[1] == 6


@pytest.mark.parametrize("fields,error,match", [
    ({"model": ""}, ArgumentValueError, "model must be non-empty"),
    ({"model": 3}, ArgumentTypeError, "model must be a str"),
    ({"dtype": None}, ArgumentTypeError, "dtype must be a str"),
    ({"model": "m\ud800"}, ArgumentValueError, "valid Unicode"),
    ({"kv_shape": ()}, ArgumentTypeError, "kv_shape must be a non-empty tuple"),
    ({"kv_shape": "2x8"}, ArgumentTypeError, "kv_shape must be a non-empty tuple"),
    ({"kv_shape": (2, 0)}, ArgumentValueError, "kv_shape entry must be > 0"),
    ({"kv_shape": (2, 8.0)}, ArgumentTypeError, "kv_shape entry must be an int"),
    ({"page_size": 0}, ArgumentValueError, "page_size must be > 0"),
    ({"page_size": True}, ArgumentTypeError, "page_size must be an int"),
    ({"tp_rank": -1}, ArgumentValueError, "tp_rank must be >= 0"),
    ({"extra": None}, ArgumentTypeError, "extra must be a str"),
])
def test_bad_fingerprint_fields_are_one_line_errors(fields, error, match):
    base = dict(model="m", dtype="float16", kv_shape=(2, 8, 128), page_size=16)
    with pytest.raises(error, match=match) as info:
        Fingerprint(**{**base, **fields})
    assert "\n" not in str(info.value)


def test_fingerprint_fields_are_normalized_and_hashable():
    fp = Fingerprint("m", "float16", [2, np.int64(8)], np.int32(16))
    assert fp.kv_shape == (2, 8) and type(fp.page_size) is int
    assert fp == Fingerprint("m", "float16", (2, 8), 16) and hash(fp) == hash(Fingerprint("m", "float16", (2, 8), 16))
    assert len(fp.digest()) == 16


@pytest.mark.parametrize("namespace,error", [
    (1.5, ArgumentTypeError), (True, ArgumentTypeError), (["a"], ArgumentTypeError), ({"a": 1}, ArgumentTypeError),
    (("a", ["b"]), ArgumentTypeError), (("a", False), ArgumentTypeError), ("\udc80", ArgumentValueError),
])
def test_bad_namespaces_are_refused(namespace, error):
    with pytest.raises(error):
        KeyChain(FP).chain(TOKENS, namespace)


def test_bad_tokens_chains_and_arguments_are_refused_at_the_boundary(memory_url):
    store = PageStore.open(memory_url, FP)
    chain = store.chain(TOKENS)
    with pytest.raises(InvalidTokensError):
        store.chain([1, -1, 2, 3])
    for bad in ("abc", b"abc", 3, None):
        with pytest.raises(ArgumentTypeError, match="chain must be a list of page keys"):
            store.lookup(bad)
    for bad in ([chain[0][:-1]], [b"xxx:" + chain[0][4:]], [chain[0].hex()]):
        with pytest.raises(ArgumentValueError, match=r"chain\[0\] is not a key of this store"):
            store.get(bad)
    with pytest.raises(ArgumentValueError, match="start must be in"):
        store.lookup(chain, 7)
    with pytest.raises(ArgumentTypeError, match="start must be an int"):
        store.get(chain, 1.0)
    with pytest.raises(ArgumentValueError, match="3 payloads for 2 pages"):
        store.put(chain, [b"x"] * 3, start=4)
    with pytest.raises(ArgumentTypeError, match="payloads must be a sequence"):
        store.put(chain, b"xyz")
    with pytest.raises(ArgumentTypeError, match=r"payloads\[1\] must be bytes or a buffer, got str"):
        store.put(chain, [b"x", "y"])
    with pytest.raises(ArgumentValueError, match=r"payloads\[0\] must be C-contiguous"):
        store.put(chain, [np.zeros((4, 4))[:, 0]])
    assert store.stats()["round_trips"] == 0  # refused before anything was sent
    assert store.lookup(chain, 6) == 0 and store.get(chain, 6) == ([], 0) and store.put(chain, [], 6) == 0


@pytest.mark.parametrize("url,match", [
    ("memory://", "needs a name"), ("memory://x?capacity=0", "positive number of pages"),
    ("memory://x?capacity=ten", "positive number"), ("memory://x?size=3", "takes only"),
    ("ftp://host", "must be memory://NAME, redis://"), ("localhost:6379", "must be memory://NAME, redis://"),
    ("redis://127.0.0.1:port", "bad Redis URL"),
])
def test_bad_urls_are_one_line_errors(url, match):
    with pytest.raises(ArgumentValueError, match=match) as info:
        PageStore.open(url, FP)
    assert "\n" not in str(info.value)


def test_bad_open_arguments_are_refused():
    with pytest.raises(ArgumentTypeError):
        PageStore.open(b"memory://x", FP)
    with pytest.raises(ArgumentTypeError):
        PageStore.open("memory://x", ("llama", "float16"))
    with pytest.raises(ArgumentValueError, match="timeout"):
        PageStore.open("memory://x", FP, timeout=0)
    with pytest.raises(ArgumentValueError, match="hash_fn"):
        PageStore.open("memory://x", FP, hash_fn="md5")
    with pytest.raises(ArgumentTypeError, match="prefix must be bytes"):
        PageStore.open("memory://x", FP, prefix="rkv:")
