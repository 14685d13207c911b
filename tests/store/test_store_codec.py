"""The value format: a 77-byte header that every read checks field by field."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from radixkv.store import codec

FP_A, FP_B = bytes(range(16)), bytes(range(1, 17))
H1, H2 = hashlib.sha256(b"1").digest(), hashlib.sha256(b"2").digest()
PAYLOAD = bytes(range(256)) * 3


def value(payload: bytes = PAYLOAD, fp: bytes = FP_A, chain_hash: bytes = H1) -> bytes:
    return codec.encode(fp, chain_hash, memoryview(payload))


def test_the_layout_is_the_documented_one():
    v = value()
    assert codec.HEADER_BYTES == 77 and len(v) == 77 + len(PAYLOAD)
    assert v[:4] == b"RKVP" and v[4] == 1 and v[5:21] == FP_A and v[21:53] == H1
    assert struct.unpack("<Q", v[53:61])[0] == len(PAYLOAD)
    assert v[61:77] == hashlib.sha256(PAYLOAD).digest()[:16] and v[77:] == PAYLOAD
    payload, why = codec.decode(v, FP_A, H1)
    assert bytes(payload) == PAYLOAD and why == "" and payload.readonly
    assert bytes(codec.decode(value(b""), FP_A, H1)[0]) == b""


def corruptions():
    v = value()
    flipped = bytearray(v)
    flipped[100] ^= 0x01
    bad_len = bytearray(v)
    bad_len[53:61] = struct.pack("<Q", len(PAYLOAD) - 1)
    bad_digest = bytearray(v)
    bad_digest[70] ^= 0x80
    return [
        (b"", "truncated header"), (v[:76], "truncated header"), (v[:-1], "length mismatch"),
        (v + b"\0", "length mismatch"), (bytes(bad_len), "length mismatch"), (b"XKVP" + v[4:], "bad magic"),
        (v[:4] + b"\x02" + v[5:], "format version 2"), (value(fp=FP_B), "another fingerprint"),
        (value(chain_hash=H2), "another page's value"), (bytes(flipped), "digest mismatch"),
        (bytes(bad_digest), "digest mismatch"), (b"\0" * 200, "bad magic"),
    ]


@pytest.mark.parametrize("bad,reason", corruptions())
def test_every_kind_of_bad_value_is_refused_with_its_reason(bad, reason):
    assert codec.decode(bad, FP_A, H1) == (None, reason)


def test_payloads_are_taken_as_flat_bytes_without_a_copy():
    arr = np.arange(12, dtype=np.float16).reshape(3, 4)
    view = codec.as_payload(arr, 0)
    assert view.nbytes == arr.nbytes and view.format == "B" and view.ndim == 1 and view.obj is not None
    assert bytes(view) == arr.tobytes()
    assert codec.as_payload(b"abc", 0).tobytes() == b"abc" and codec.as_payload(bytearray(b"ab"), 0).nbytes == 2
    stored = value(arr.tobytes())
    back = np.frombuffer(codec.decode(stored, FP_A, H1)[0], dtype=np.float16).reshape(3, 4)
    assert np.array_equal(back, arr)
