"""KV events on the wire, in vLLM 0.33.0's ZMQ format, for KV-aware routers.

:class:`ZmqEventPublisher` speaks the protocol of vLLM's own
``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``), so a router or
subscriber written for vLLM subscribes to a radixkv cache unchanged:

* a PUB socket sends one multipart message per batch: ``(topic, seq, payload)``
  with ``seq`` an 8-byte big-endian sequence number counting batches from 0;
* ``payload`` is the msgpack encoding of vLLM's ``KVEventBatch``, an array
  ``[ts, [events], data_parallel_rank]``; each event is a map tagged
  ``{"type": class name, ...}`` with vLLM's field names in vLLM's order and
  fields left at their default omitted (msgspec's ``tag=True,
  omit_defaults=True``): ``BlockStored(block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, [extra_keys], group_idx)``,
  ``BlockRemoved(block_hashes, medium, group_idx)``, ``AllBlocksCleared()``;
* an optional ROUTER replay socket: a client sends the first sequence number it
  missed (8 bytes big-endian) and gets ``(topic, seq, payload)`` for every
  buffered batch from there on, then the end marker ``(b"", -1, b"")``.

Hashes go out as the cache recorded them (see
:class:`~radixkv.events.hashing.BlockHasher`): 64-bit ints by default, as vLLM 0.33.0
with its default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, or the full hash
bytes with ``BlockHasher(use_int_block_hashes=False)``. radixkv's tier moves
become vLLM's offloading events: ``BlockStored``/``BlockRemoved`` on medium
``"CPU"`` (host tier) or ``"STORAGE"`` (disk, ``locality="LOCAL"``; remote,
``locality="REMOTE"``); a tier of another name on its own medium (``"ssd"``: ``"SSD"``).

Needs ``pyzmq`` and ``msgspec`` (``pip install 'radixkv[events]'``), imported
when a publisher is created.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ..errors import ArgumentTypeError, ArgumentValueError, MissingExtraError
from .log import (
    AllBlocksCleared,
    BlockDemoted,
    BlockPromoted,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    MEDIUM_CPU,
    MEDIUM_DISK,
    MEDIUM_GPU,
    MEDIUM_REMOTE,
)
from .hashing import external_block_hash

WIRE_MEDIUM: Dict[str, Tuple[str, Optional[str]]] = {
    MEDIUM_GPU: ("GPU", None),
    MEDIUM_CPU: ("CPU", None),
    MEDIUM_DISK: ("STORAGE", "LOCAL"),
    MEDIUM_REMOTE: ("STORAGE", "REMOTE"),
}
"""radixkv medium -> vLLM's (``medium``, ``locality``) on the wire. Any other medium (a tier
named otherwise reports its upper-cased name: ``"ssd"`` -> ``"SSD"``) goes out as itself with
no locality (see :func:`wire_medium`)."""

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""Sequence number of the replay socket's end-of-replay marker."""


def _wire_hashes(hashes: Iterable[Any], use_int: Optional[bool]) -> List[Any]:
    out = list(hashes)
    for h in out:
        if isinstance(h, bool) or not isinstance(h, (int, bytes)):
            raise ArgumentTypeError(f"block hashes must be ints or bytes, got {h!r}")
    if use_int:
        return [h if isinstance(h, int) else external_block_hash(h) for h in out]
    if use_int is False and any(isinstance(h, int) for h in out):
        raise ArgumentValueError(
            "use_int_block_hashes=False needs events with the full hash bytes: create the cache with "
            "enable_events=BlockHasher(use_int_block_hashes=False)")
    return out


def wire_medium(medium: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """vLLM's ``(medium, locality)`` for a radixkv ``medium``. O(1).

    The media of :data:`WIRE_MEDIUM` map to vLLM's values; any other string (every tier name
    has one, so a tier's events never fail to encode) is sent as itself, vLLM's ``medium``
    being a free optional str, with ``locality`` left out: radixkv knows no more of such a
    tier than its name (a router keys residency by the pair, so its pages count on their own
    medium). Raises ``TypeError`` for a medium that is neither a str nor ``None``.
    """
    if medium is None:
        return None, None
    if not isinstance(medium, str):
        raise ArgumentTypeError(f"an event's medium must be a str or None, got {medium!r}")
    return WIRE_MEDIUM.get(medium) or (medium, None)


def _stored(event: BlockStored, use_int: Optional[bool]) -> Dict[str, Any]:
    medium, locality = wire_medium(event.medium)
    parent = event.parent_block_hash
    out: Dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": _wire_hashes(event.block_hashes, use_int),
        "parent_block_hash": None if parent is None else _wire_hashes([parent], use_int)[0],
        "token_ids": list(event.token_ids),
        "block_size": event.block_size,
        "lora_id": event.lora_id,
        "medium": medium,
        "lora_name": event.lora_name,
    }
    if event.extra_keys is not None:
        out["extra_keys"] = list(event.extra_keys)
    out["group_idx"] = 0
    if locality is not None:
        out["locality"] = locality
    return out


def _removed(event: BlockRemoved, use_int: Optional[bool]) -> Dict[str, Any]:
    medium, locality = wire_medium(event.medium)
    out: Dict[str, Any] = {"type": "BlockRemoved", "block_hashes": _wire_hashes(event.block_hashes, use_int),
                           "medium": medium, "group_idx": 0}
    if locality is not None:
        out["locality"] = locality
    return out


def to_vllm_events(events: Iterable[KVCacheEvent], *, exclusive_tiers: bool = True,
                   use_int_block_hashes: Optional[bool] = None) -> List[Dict[str, Any]]:
    """radixkv events as vLLM 0.33.0's wire events: dicts in vLLM's field order, defaults omitted.

    ``group_idx`` is 0 (one KV cache group, as a vLLM with one attention type
    reports). :class:`~radixkv.events.BlockDemoted` becomes a ``BlockStored`` on
    the lower tier; :class:`~radixkv.events.BlockPromoted` a ``BlockRemoved``
    from it when ``exclusive_tiers`` (a write-back tier gives its copy up),
    else nothing. ``use_int_block_hashes``: ``None`` sends hashes as recorded,
    ``True`` converts bytes to the 64-bit form, ``False`` insists on bytes.
    Cost: O(pages + tokens).
    """
    out: List[Dict[str, Any]] = []
    for event in events:
        if isinstance(event, BlockDemoted):
            out.extend(_stored(e, use_int_block_hashes) for e in event.as_store_remove())
        elif isinstance(event, BlockPromoted):
            out.extend(_removed(e, use_int_block_hashes) for e in event.as_store_remove(exclusive=exclusive_tiers))
        elif isinstance(event, BlockStored):
            out.append(_stored(event, use_int_block_hashes))
        elif isinstance(event, BlockRemoved):
            out.append(_removed(event, use_int_block_hashes))
        elif isinstance(event, AllBlocksCleared):
            out.append({"type": "AllBlocksCleared"})
        else:
            raise ArgumentTypeError(f"not a radixkv KV event: {event!r}")
    return out


def _modules() -> Tuple[Any, Any]:
    try:
        import msgspec
        import zmq
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingExtraError(f"KV events on the wire need pyzmq and msgspec: pip install 'radixkv[events]' ({exc})") from exc
    return zmq, msgspec


def require_extras() -> None:
    """Raise :class:`~radixkv.errors.MissingExtraError` (naming ``radixkv[events]``) unless pyzmq and msgspec
    import: for a caller that would otherwise find out only after starting processes."""
    _modules()


_STRUCTS: Dict[str, Any] = {}


def _wire_structs() -> Dict[str, Any]:
    """msgspec structs declared as vLLM 0.33.0 declares its own, built on first use (msgspec is optional).

    Encoding through the same struct configuration gives vLLM's exact bytes
    (e.g. msgspec writes a map16 header for ``BlockStored``, whose 15 fields
    plus tag could exceed a fixmap, whatever the number left after omissions).
    """
    if _STRUCTS:
        return _STRUCTS
    _, msgspec = _modules()
    Hash = Union[bytes, int]
    Opt = Optional
    base = msgspec.defstruct("KVCacheEvent", [], omit_defaults=True, gc=False, tag=True)
    stored = msgspec.defstruct("BlockStored", [
        ("block_hashes", List[Hash]), ("parent_block_hash", Opt[Hash]), ("token_ids", List[int]),
        ("block_size", int), ("lora_id", Opt[int]), ("medium", Opt[str]), ("lora_name", Opt[str]),
        ("extra_keys", Opt[List[Opt[Tuple[Any, ...]]]], None), ("group_idx", Opt[int], None),
        ("kv_cache_spec_kind", Opt[str], None), ("kv_cache_spec_sliding_window", Opt[int], None),
        ("locality", Opt[str], None), ("ownership", Opt[str], None), ("session_id", Opt[str], None),
        ("lookahead_token_ids", Opt[List[List[int]]], None)], bases=(base,))
    removed = msgspec.defstruct("BlockRemoved", [
        ("block_hashes", List[Hash]), ("medium", Opt[str]), ("group_idx", Opt[int], None),
        ("locality", Opt[str], None), ("ownership", Opt[str], None)], bases=(base,))
    cleared = msgspec.defstruct("AllBlocksCleared", [], bases=(base,))
    batch = msgspec.defstruct("KVEventBatch", [
        ("ts", float), ("events", List[Union[stored, removed, cleared]]), ("data_parallel_rank", Opt[int], None)],
        array_like=True, omit_defaults=True, gc=False)
    _STRUCTS.update(BlockStored=stored, BlockRemoved=removed, AllBlocksCleared=cleared,
                    KVEventBatch=batch, encode=msgspec.msgpack.Encoder().encode)
    return _STRUCTS


def encode_batch(events: Iterable[KVCacheEvent], *, ts: Optional[float] = None, data_parallel_rank: int = 0,
                 exclusive_tiers: bool = True, use_int_block_hashes: Optional[bool] = None) -> bytes:
    """The msgpack payload of one vLLM ``KVEventBatch`` ``[ts, [events], data_parallel_rank]``.

    Byte-identical to vLLM's encoder for the same events. ``ts`` defaults to
    ``time.time()``; other arguments as :func:`to_vllm_events`.
    """
    structs = _wire_structs()
    wire = [structs[w["type"]](**{k: v for k, v in w.items() if k != "type"})
            for w in to_vllm_events(events, exclusive_tiers=exclusive_tiers, use_int_block_hashes=use_int_block_hashes)]
    batch = structs["KVEventBatch"](time.time() if ts is None else float(ts), wire, data_parallel_rank)
    return structs["encode"](batch)


def _is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard and ipc/inproc endpoints, connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """Publishes radixkv's KV events on a ZMQ PUB socket in vLLM 0.33.0's wire format.

    >>> from radixkv import PrefixCache
    >>> cache = PrefixCache(num_blocks=8, page_size=2, enable_events=True)
    >>> with ZmqEventPublisher("tcp://127.0.0.1:*") as publisher:   # doctest: +SKIP
    ...     cache.admit([1, 2, 3, 4]).release()
    ...     publish_from(cache, publisher)
    0

    Args:
        endpoint: PUB address; ``tcp://*:5557`` (or any address with ``*``,
            ``ipc://``, ``inproc://``) binds, ``tcp://host:port`` connects.
            :attr:`endpoint` holds the bound address (a ``*`` port resolved).
        topic: topic frame of every message.
        replay_endpoint: ROUTER address (bound) answering replay requests; ``None``: no replay.
        buffer_steps: batches kept for replay.
        hwm: the PUB socket's high-water mark (messages queued per subscriber).
        data_parallel_rank: the rank written into every batch.
        exclusive_tiers, use_int_block_hashes: as :func:`to_vllm_events`.

    :meth:`publish` encodes on the caller's thread (so a bad event raises
    there) and hands the payload to a sender thread, which owns both sockets,
    sends in order and serves replay requests between batches. Cost per batch:
    O(pages + tokens) to encode, a queue hand-off, one ZMQ send.
    """

    def __init__(self, endpoint: str = "tcp://*:5557", *, topic: str = "", replay_endpoint: Optional[str] = None,
                 buffer_steps: int = 10_000, hwm: int = 100_000, data_parallel_rank: int = 0,
                 exclusive_tiers: bool = True, use_int_block_hashes: Optional[bool] = None) -> None:
        for name, value in (("endpoint", endpoint), ("topic", topic)):
            if not isinstance(value, str):
                raise ArgumentTypeError(f"{name} must be a str, got {value!r}")
        if replay_endpoint is not None and not isinstance(replay_endpoint, str):
            raise ArgumentTypeError(f"replay_endpoint must be a str or None, got {replay_endpoint!r}")
        for name, value in (("buffer_steps", buffer_steps), ("hwm", hwm), ("data_parallel_rank", data_parallel_rank)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentTypeError(f"{name} must be an int, got {value!r}")
        if buffer_steps < 1 or hwm < 0 or data_parallel_rank < 0:
            raise ArgumentValueError(f"need buffer_steps >= 1, hwm >= 0, data_parallel_rank >= 0; got "
                                     f"{buffer_steps}, {hwm}, {data_parallel_rank}")
        if use_int_block_hashes is not None and not isinstance(use_int_block_hashes, bool):
            raise ArgumentTypeError(f"use_int_block_hashes must be a bool or None, got {use_int_block_hashes!r}")
        zmq, _ = _modules()
        self.topic = topic
        self.data_parallel_rank = data_parallel_rank
        self.exclusive_tiers = bool(exclusive_tiers)
        self.use_int_block_hashes = use_int_block_hashes
        self._topic = topic.encode("utf-8")
        self._buffer_steps = buffer_steps
        self._next_seq = 0
        self._lock = threading.Lock()
        self.send_errors = 0
        self._queue: "queue.Queue[Optional[Tuple[int, bytes]]]" = queue.Queue()
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay = None
        try:
            self._pub.set_hwm(hwm)
            self.endpoint = self._open(self._pub, endpoint, bind=_is_bind_endpoint(endpoint))
            self.replay_endpoint: Optional[str] = None
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))  # a full replay plus its marker
                self.replay_endpoint = self._open(self._replay, replay_endpoint, bind=True)
        except Exception:
            self._close_sockets()
            raise
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="radixkv-kv-events", daemon=True)
        self._thread.start()

    @staticmethod
    def _open(sock: Any, endpoint: str, *, bind: bool) -> str:
        import zmq

        try:
            if not bind:
                sock.connect(endpoint)
                return endpoint
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise ArgumentValueError(f"cannot {'bind' if bind else 'connect'} ZMQ endpoint {endpoint!r}: {exc}") from exc
        return sock.getsockopt(zmq.LAST_ENDPOINT).decode()

    # ------------------------------------------------------------ API
    def publish(self, events: Iterable[KVCacheEvent], *, ts: Optional[float] = None) -> Optional[int]:
        """Send ``events`` as one batch; returns its sequence number, or ``None`` if there were none.

        Like vLLM's scheduler, an empty step sends nothing.
        """
        if self._closed:
            raise ArgumentValueError("publisher is closed")
        events = list(events)
        if not events:
            return None
        payload = encode_batch(events, ts=ts, data_parallel_rank=self.data_parallel_rank,
                               exclusive_tiers=self.exclusive_tiers, use_int_block_hashes=self.use_int_block_hashes)
        with self._lock:  # sequence numbers in queue order, whichever thread publishes
            seq = self._next_seq
            self._queue.put((seq, payload))
            self._next_seq = seq + 1  # only once queued: a failed hand-off leaves no gap
        return seq

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every batch published so far has been handed to the PUB socket (``publish`` only
        queues it for the sender thread); whether that happened within ``timeout`` seconds. What a
        subscriber that connects afterwards can get only from the replay endpoint."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.001)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to ``timeout`` seconds), stop the thread, close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        self._close_sockets()

    def __enter__(self) -> "ZmqEventPublisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ZmqEventPublisher(endpoint={self.endpoint!r}, topic={self.topic!r}, "
                f"replay_endpoint={self.replay_endpoint!r}, next_seq={self._next_seq})")

    # ------------------------------------------------------------ sender thread
    def _run(self) -> None:
        from collections import deque

        buffer: "deque[Tuple[int, bytes]]" = deque(maxlen=self._buffer_steps)
        while True:
            if self._replay is not None:
                while self._replay.poll(0):
                    self._serve_replay(buffer)
            try:
                item = self._queue.get(timeout=0.01)
            except queue.Empty:
                continue
            if item is None:
                self._queue.task_done()
                return
            seq, payload = item
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except Exception:  # a send failure must not stop the stream: counted, and the batch stays replayable
                self.send_errors += 1
            buffer.append(item)
            self._queue.task_done()

    def _serve_replay(self, buffer: Iterable[Tuple[int, bytes]]) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:  # not (client id, empty delimiter, start seq): ignored, as vLLM does
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in buffer:
            if seq >= first:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=1000)


def publish_from(cache: Any, publisher: ZmqEventPublisher) -> Optional[int]:
    """Take ``cache``'s pending events and publish them as one batch (one engine step).

    ``cache`` is a :class:`~radixkv.PrefixCache` (or ``TieredCache``) created
    with ``enable_events``. Returns the batch's sequence number, ``None`` if
    there was nothing to send. Call it after each scheduling step. A publish
    that raises (an event that does not encode, a failed hand-off to the
    sender) puts the events back in the log: the next call sends them, so no
    step's events are lost or sent twice. Cost: the publish's.
    """
    log = cache.event_log
    if log is None:
        raise ArgumentValueError("publish_from needs a cache created with enable_events")
    events = cache.take_events()
    try:
        return publisher.publish(events)
    except BaseException:
        log.restore(events)
        raise


__all__ = ["END_SEQ", "WIRE_MEDIUM", "ZmqEventPublisher", "encode_batch", "publish_from", "require_extras",
           "to_vllm_events", "wire_medium"]
